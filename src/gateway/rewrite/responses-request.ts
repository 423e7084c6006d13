/**
 * OpenAI Responses API requests (`POST /v1/responses`), read into the canonical shape: a client
 * of the Responses API calling a provider of another format. Only the client's side exists: the
 * provider is called in its format's chat API.
 *
 * `input` is a string or a list of items: messages (roles user, assistant, system, developer),
 * `function_call` items (the assistant's earlier calls) and `function_call_output` items (their
 * answers). `instructions` and leading system/developer messages become the one system prompt.
 * Anything that needs OpenAI's own state or tools (`previous_response_id`, `conversation`,
 * built-in tools, reasoning items, file ids, `store: true`) is refused by name, never dropped.
 */
import {
  arrayOf,
  compact,
  isObject,
  optionalNumber,
  optionalString,
  parseArguments,
  Untranslatable,
  type ChatRequest,
  type JsonObject,
  type Part,
  type Tool,
  type ToolChoice,
} from './canonical.ts';
import { imageSource } from './openai-request.ts';

const REQUEST_MEMBERS = new Set([
  'model',
  'input',
  'instructions',
  'max_output_tokens',
  'temperature',
  'top_p',
  'stream',
  'tools',
  'tool_choice',
  'parallel_tool_calls',
  'user',
  'store',
  'text',
]);
const MESSAGE_MEMBERS = new Set(['type', 'role', 'content', 'id', 'status']);

type Path = (string | number)[];

export function readResponsesRequest(body: JsonObject, problems: Untranslatable): ChatRequest {
  problems.unknownMembers(body, REQUEST_MEMBERS, []);
  const request: ChatRequest = { model: optionalString(body, 'model', [], problems) ?? '', messages: [], stream: body.stream === true };
  const maxTokens = optionalNumber(body, 'max_output_tokens', [], problems);
  if (maxTokens !== undefined) request.maxTokens = maxTokens;
  const temperature = optionalNumber(body, 'temperature', [], problems);
  if (temperature !== undefined) request.temperature = temperature;
  const topP = optionalNumber(body, 'top_p', [], problems);
  if (topP !== undefined) request.topP = topP;
  const user = optionalString(body, 'user', [], problems);
  if (user !== undefined) request.user = user;
  // Nothing is kept for a later call to refer to: only a client that asks for nothing to be stored can be served.
  if (body.store === true) problems.add(['store'], 'the rewrite proxy keeps no responses; send store: false');
  if (body.parallel_tool_calls === false) problems.add(['parallel_tool_calls'], 'only parallel tool calls (the default) can be translated');
  readTextOptions(body.text, problems);

  const system: string[] = [];
  const instructions = optionalString(body, 'instructions', [], problems);
  if (instructions !== undefined && instructions !== '') system.push(instructions);
  if (typeof body.input === 'string') request.messages.push({ role: 'user', parts: [{ type: 'text', text: body.input }] });
  else arrayOf(body, 'input', [], problems).forEach((item, i) => readItem(item, ['input', i], request, system, problems));
  if (system.length > 0) request.system = system.join('\n\n');

  const tools = arrayOf(body, 'tools', [], problems).map((tool, i) => readTool(tool, ['tools', i], problems));
  if (tools.length > 0) request.tools = tools;
  if (body.tool_choice !== undefined && body.tool_choice !== null) request.toolChoice = readToolChoice(body.tool_choice, problems);
  return request;
}

/** `text: {format: {type: 'text'}}` is plain text, what every format answers; a JSON schema is not translated. */
function readTextOptions(text: unknown, problems: Untranslatable): void {
  if (text === undefined || text === null) return;
  if (!isObject(text)) return problems.add(['text'], 'must be an object');
  problems.unknownMembers(text, new Set(['format']), ['text']);
  if (text.format === undefined || (isObject(text.format) && text.format.type === 'text' && Object.keys(text.format).length === 1)) return;
  problems.add(['text', 'format'], 'only the text format can be translated');
}

function readItem(item: unknown, path: Path, request: ChatRequest, system: string[], problems: Untranslatable): void {
  if (!isObject(item)) return problems.add(path, 'must be an object');
  const type = item.type ?? 'message';
  if (type === 'message') return readMessage(item, path, request, system, problems);
  if (type === 'function_call') {
    problems.unknownMembers(item, new Set(['type', 'id', 'call_id', 'name', 'arguments', 'status']), path);
    const part: Part = {
      type: 'tool_call',
      call: {
        id: optionalString(item, 'call_id', path, problems) ?? '',
        name: optionalString(item, 'name', path, problems) ?? '',
        arguments: parseArguments(optionalString(item, 'arguments', path, problems) ?? '', [...path, 'arguments'], problems),
      },
    };
    const last = request.messages.at(-1);
    // Calls made in one turn follow each other as items; the other formats keep them in one assistant turn.
    if (last?.role === 'assistant') last.parts.push(part);
    else request.messages.push({ role: 'assistant', parts: [part] });
    return;
  }
  if (type === 'function_call_output') {
    problems.unknownMembers(item, new Set(['type', 'id', 'call_id', 'output', 'status']), path);
    const part: Part = { type: 'tool_result', callId: optionalString(item, 'call_id', path, problems) ?? '', content: outputText(item.output, [...path, 'output'], problems), isError: false };
    const last = request.messages.at(-1);
    if (last?.role === 'user' && last.parts.every((p) => p.type === 'tool_result')) last.parts.push(part);
    else request.messages.push({ role: 'user', parts: [part] });
    return;
  }
  problems.add([...path, 'type'], `input items of type ${JSON.stringify(type)} cannot be translated`);
}

function readMessage(item: JsonObject, path: Path, request: ChatRequest, system: string[], problems: Untranslatable): void {
  problems.unknownMembers(item, MESSAGE_MEMBERS, path);
  const role = item.role;
  if (role === 'system' || role === 'developer') {
    if (request.messages.length > 0) return problems.add([...path, 'role'], 'a system message can only come before the conversation');
    system.push(contentParts(item.content, [...path, 'content'], problems).map((p) => (p.type === 'text' ? p.text : '')).join(''));
    return;
  }
  if (role !== 'user' && role !== 'assistant') return problems.add([...path, 'role'], `role ${JSON.stringify(role)} is not supported by the rewrite proxy`);
  const parts = contentParts(item.content, [...path, 'content'], problems);
  if (role === 'assistant' && parts.some((p) => p.type === 'image')) problems.add([...path, 'content'], 'an assistant message can only hold text');
  const last = request.messages.at(-1);
  if (role === 'assistant' && last?.role === 'assistant') last.parts.push(...parts);
  else request.messages.push({ role, parts });
}

/** A message's content: a string, or parts of type input_text / output_text / input_image. */
function contentParts(content: unknown, path: Path, problems: Untranslatable): Part[] {
  if (typeof content === 'string') return [{ type: 'text', text: content }];
  if (!Array.isArray(content)) {
    problems.add(path, 'must be a string or an array of parts');
    return [];
  }
  const parts: Part[] = [];
  content.forEach((part, i) => {
    const at = [...path, i];
    if (isObject(part) && (part.type === 'input_text' || part.type === 'output_text') && typeof part.text === 'string') {
      // OpenAI returns annotations and logprobs with its own text; sent back empty, they carry nothing.
      problems.unknownMembers(part, new Set(['type', 'text', 'annotations', 'logprobs']), at);
      if (Array.isArray(part.annotations) && part.annotations.length > 0) problems.add([...at, 'annotations'], 'cannot be translated');
      parts.push({ type: 'text', text: part.text });
    } else if (isObject(part) && part.type === 'input_image' && typeof part.image_url === 'string') {
      problems.unknownMembers(part, new Set(['type', 'image_url', 'detail']), at);
      if (part.detail !== undefined && part.detail !== 'auto') problems.add([...at, 'detail'], 'only the auto detail can be translated');
      parts.push({ type: 'image', source: imageSource(part.image_url) });
    } else {
      problems.add(at, 'only input_text, output_text and input_image parts (by URL) can be translated');
    }
  });
  return parts;
}

/** A tool's output: a string, or input_text parts. */
function outputText(output: unknown, path: Path, problems: Untranslatable): string {
  if (typeof output === 'string') return output;
  const parts = contentParts(output, path, problems);
  if (parts.some((p) => p.type !== 'text')) problems.add(path, 'only text tool output can be translated');
  return parts.map((p) => (p.type === 'text' ? p.text : '')).join('');
}

function readTool(tool: unknown, path: Path, problems: Untranslatable): Tool {
  if (!isObject(tool) || tool.type !== 'function') {
    problems.add(path, 'only function tools can be translated');
    return { name: '', parameters: {} };
  }
  problems.unknownMembers(tool, new Set(['type', 'name', 'description', 'parameters', 'strict']), path);
  if (tool.strict === true) problems.add([...path, 'strict'], 'strict schema adherence cannot be translated');
  return compact({
    name: optionalString(tool, 'name', path, problems) ?? '',
    description: optionalString(tool, 'description', path, problems),
    parameters: isObject(tool.parameters) ? tool.parameters : { type: 'object', properties: {} },
  });
}

function readToolChoice(choice: unknown, problems: Untranslatable): ToolChoice {
  if (choice === 'auto' || choice === 'none' || choice === 'required') return { type: choice };
  if (isObject(choice) && choice.type === 'function' && typeof choice.name === 'string') return { type: 'tool', name: choice.name };
  problems.add(['tool_choice'], 'must be auto, none, required or a function');
  return { type: 'auto' };
}
