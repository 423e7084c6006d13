/**
 * Gemini generateContent requests, read into and written from the canonical shape. The model and
 * whether to stream are in Gemini's URL, not its body: the route passes and takes them apart.
 * A tool's answer is an object in Gemini: text goes in as `{output}` (`{error}` for a failure),
 * the documented keys, and comes back as that text; any other object comes back as its JSON text.
 */
import {
  arrayOf,
  compact,
  isObject,
  optionalNumber,
  optionalString,
  Untranslatable,
  type ChatRequest,
  type JsonObject,
  type Message,
  type Part,
  type Tool,
  type ToolChoice,
} from './canonical.ts';

const REQUEST_MEMBERS = new Set(['contents', 'systemInstruction', 'generationConfig', 'tools', 'toolConfig']);
const GENERATION_MEMBERS = new Set(['maxOutputTokens', 'temperature', 'topP', 'topK', 'stopSequences', 'candidateCount']);

/** Where the URL names the call: `models/{model}:generateContent` or `:streamGenerateContent`. */
export type GoogleCall = { model: string; stream: boolean };

export function readGoogleRequest(body: JsonObject, call: GoogleCall, problems: Untranslatable): ChatRequest {
  problems.unknownMembers(body, REQUEST_MEMBERS, []);
  const request: ChatRequest = { model: call.model, messages: [], stream: call.stream };
  if (isObject(body.systemInstruction)) request.system = partsText(body.systemInstruction, ['systemInstruction'], problems);
  if (isObject(body.generationConfig)) readGenerationConfig(body.generationConfig, request, problems);
  const names = new Map<string, string>();
  arrayOf(body, 'contents', [], problems).forEach((content, i) => {
    const message = readContent(content, ['contents', i], names, problems);
    if (message) request.messages.push(message);
  });
  const tools = arrayOf(body, 'tools', [], problems).flatMap((tool, i) => readTools(tool, ['tools', i], problems));
  if (tools.length > 0) request.tools = tools;
  if (isObject(body.toolConfig)) request.toolChoice = readToolConfig(body.toolConfig, problems);
  return request;
}

function readGenerationConfig(config: JsonObject, request: ChatRequest, problems: Untranslatable): void {
  const path = ['generationConfig'];
  problems.unknownMembers(config, GENERATION_MEMBERS, path);
  if (config.candidateCount !== undefined && config.candidateCount !== 1) problems.add([...path, 'candidateCount'], 'only 1 candidate can be translated');
  const numbers = [
    ['maxOutputTokens', 'maxTokens'],
    ['temperature', 'temperature'],
    ['topP', 'topP'],
    ['topK', 'topK'],
  ] as const;
  for (const [member, field] of numbers) {
    const value = optionalNumber(config, member, path, problems);
    if (value !== undefined) request[field] = value;
  }
  const stop = arrayOf(config, 'stopSequences', path, problems).filter((s): s is string => typeof s === 'string');
  if (stop.length > 0) request.stop = stop;
}

function partsText(content: JsonObject, path: (string | number)[], problems: Untranslatable): string {
  return arrayOf(content, 'parts', path, problems)
    .map((part, i) => {
      if (isObject(part) && typeof part.text === 'string') return part.text;
      problems.add([...path, 'parts', i], 'only text parts can be translated');
      return '';
    })
    .join('');
}

/** `names` maps a call id to its function name, so a tool answer can be matched to its call. */
function readContent(content: unknown, path: (string | number)[], names: Map<string, string>, problems: Untranslatable): Message | undefined {
  if (!isObject(content)) {
    problems.add(path, 'must be a content object');
    return undefined;
  }
  problems.unknownMembers(content, new Set(['role', 'parts']), path);
  const role = content.role === 'model' ? 'assistant' : 'user';
  if (content.role !== undefined && content.role !== 'user' && content.role !== 'model') problems.add([...path, 'role'], 'must be user or model');
  const parts = arrayOf(content, 'parts', path, problems).flatMap((part, i) => readPart(part, [...path, 'parts', i], names, problems));
  return { role, parts };
}

function readPart(part: unknown, path: (string | number)[], names: Map<string, string>, problems: Untranslatable): Part[] {
  if (isObject(part) && typeof part.text === 'string') {
    problems.unknownMembers(part, new Set(['text']), path);
    return [{ type: 'text', text: part.text }];
  }
  if (isObject(part) && isObject(part.inlineData)) {
    problems.unknownMembers(part, new Set(['inlineData']), path);
    problems.unknownMembers(part.inlineData, new Set(['mimeType', 'data']), [...path, 'inlineData']);
    const mediaType = optionalString(part.inlineData, 'mimeType', [...path, 'inlineData'], problems) ?? '';
    const data = optionalString(part.inlineData, 'data', [...path, 'inlineData'], problems) ?? '';
    return [{ type: 'image', source: { kind: 'base64', mediaType, data } }];
  }
  if (isObject(part) && isObject(part.functionCall)) {
    problems.unknownMembers(part, new Set(['functionCall']), path);
    const call = part.functionCall;
    problems.unknownMembers(call, new Set(['id', 'name', 'args']), [...path, 'functionCall']);
    const name = optionalString(call, 'name', [...path, 'functionCall'], problems) ?? '';
    const id = optionalString(call, 'id', [...path, 'functionCall'], problems) ?? `call_${name}_${names.size}`;
    names.set(id, name);
    return [{ type: 'tool_call', call: { id, name, arguments: isObject(call.args) ? call.args : {} } }];
  }
  if (isObject(part) && isObject(part.functionResponse)) {
    problems.unknownMembers(part, new Set(['functionResponse']), path);
    const answer = part.functionResponse;
    problems.unknownMembers(answer, new Set(['id', 'name', 'response']), [...path, 'functionResponse']);
    const name = optionalString(answer, 'name', [...path, 'functionResponse'], problems) ?? '';
    const callId = optionalString(answer, 'id', [...path, 'functionResponse'], problems) ?? lastCallNamed(names, name);
    return [{ type: 'tool_result', callId, ...toolAnswer(answer.response) }];
  }
  problems.add(path, 'only text, inlineData, functionCall and functionResponse parts can be translated');
  return [];
}

/** A call without an id (older Gemini) is answered by name: the latest call of that name. */
function lastCallNamed(names: Map<string, string>, name: string): string {
  let found = `call_${name}`;
  for (const [id, callName] of names) if (callName === name) found = id;
  return found;
}

function toolAnswer(response: unknown): { content: string; isError: boolean } {
  if (isObject(response)) {
    const keys = Object.keys(response);
    if (keys.length === 1 && typeof response.output === 'string') return { content: response.output, isError: false };
    if (keys.length === 1 && typeof response.error === 'string') return { content: response.error, isError: true };
  }
  return { content: JSON.stringify(response ?? {}), isError: false };
}

function readTools(tool: unknown, path: (string | number)[], problems: Untranslatable): Tool[] {
  if (!isObject(tool) || !Array.isArray(tool.functionDeclarations)) {
    problems.add(path, 'only functionDeclarations can be translated');
    return [];
  }
  problems.unknownMembers(tool, new Set(['functionDeclarations']), path);
  return tool.functionDeclarations.map((declaration, i) => {
    const at = [...path, 'functionDeclarations', i];
    if (!isObject(declaration)) {
      problems.add(at, 'must be an object');
      return { name: '', parameters: {} };
    }
    problems.unknownMembers(declaration, new Set(['name', 'description', 'parameters']), at);
    return compact({
      name: optionalString(declaration, 'name', at, problems) ?? '',
      description: optionalString(declaration, 'description', at, problems),
      parameters: isObject(declaration.parameters) ? declaration.parameters : { type: 'object', properties: {} },
    });
  });
}

function readToolConfig(config: JsonObject, problems: Untranslatable): ToolChoice {
  problems.unknownMembers(config, new Set(['functionCallingConfig']), ['toolConfig']);
  const calling = isObject(config.functionCallingConfig) ? config.functionCallingConfig : {};
  const path = ['toolConfig', 'functionCallingConfig'];
  problems.unknownMembers(calling, new Set(['mode', 'allowedFunctionNames']), path);
  const allowed = arrayOf(calling, 'allowedFunctionNames', path, problems);
  if (calling.mode === 'ANY' && allowed.length === 1 && typeof allowed[0] === 'string') return { type: 'tool', name: allowed[0] };
  if (allowed.length > 0) problems.add([...path, 'allowedFunctionNames'], 'only one name, with mode ANY, can be translated');
  if (calling.mode === 'ANY') return { type: 'required' };
  if (calling.mode === 'NONE') return { type: 'none' };
  if (calling.mode !== undefined && calling.mode !== 'AUTO') problems.add([...path, 'mode'], 'must be AUTO, ANY or NONE');
  return { type: 'auto' };
}

/** The request body as Gemini's generateContent takes it (the model goes in the URL). */
export function writeGoogleRequest(request: ChatRequest, problems: Untranslatable): JsonObject {
  if (request.user !== undefined) problems.add(['user'], 'Gemini has no end-user identifier');
  const names = new Map<string, string>();
  const contents = request.messages.map((message, i) => writeContent(message, ['messages', i], names, problems));
  const generationConfig = compact({
    maxOutputTokens: request.maxTokens,
    temperature: request.temperature,
    topP: request.topP,
    topK: request.topK,
    stopSequences: request.stop,
  });
  return compact({
    systemInstruction: request.system !== undefined ? { parts: [{ text: request.system }] } : undefined,
    contents,
    generationConfig: Object.keys(generationConfig).length > 0 ? generationConfig : undefined,
    tools: request.tools ? [{ functionDeclarations: request.tools.map((t) => compact({ name: t.name, description: t.description, parameters: t.parameters })) }] : undefined,
    toolConfig: request.toolChoice ? { functionCallingConfig: writeToolChoice(request.toolChoice) } : undefined,
  });
}

function writeContent(message: Message, path: (string | number)[], names: Map<string, string>, problems: Untranslatable): JsonObject {
  const parts = message.parts.map((part): JsonObject => {
    switch (part.type) {
      case 'text':
        return { text: part.text };
      case 'image':
        if (part.source.kind === 'url') {
          problems.add(path, 'Gemini takes images inline (base64), not by URL');
          return { text: '' };
        }
        return { inlineData: { mimeType: part.source.mediaType, data: part.source.data } };
      case 'tool_call':
        names.set(part.call.id, part.call.name);
        return { functionCall: { id: part.call.id, name: part.call.name, args: part.call.arguments } };
      case 'tool_result': {
        const name = names.get(part.callId);
        if (name === undefined) problems.add(path, `the tool result for ${part.callId} answers no earlier tool call`);
        return { functionResponse: { id: part.callId, name: name ?? '', response: part.isError ? { error: part.content } : { output: part.content } } };
      }
    }
  });
  return { role: message.role === 'assistant' ? 'model' : 'user', parts };
}

function writeToolChoice(choice: ToolChoice | undefined): JsonObject {
  switch (choice?.type) {
    case 'none':
      return { mode: 'NONE' };
    case 'required':
      return { mode: 'ANY' };
    case 'tool':
      return { mode: 'ANY', allowedFunctionNames: [choice.name] };
    default:
      return { mode: 'AUTO' };
  }
}
