/**
 * OpenAI Chat Completions requests, read into and written from the canonical shape.
 * System and developer messages may only lead the conversation: the other formats have one system
 * prompt, so a later one would change meaning if moved.
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
  type ImageSource,
  type JsonObject,
  type Message,
  type Part,
  type Tool,
  type ToolChoice,
} from './canonical.ts';

const REQUEST_MEMBERS = new Set([
  'model',
  'messages',
  'max_tokens',
  'max_completion_tokens',
  'temperature',
  'top_p',
  'stop',
  'stream',
  'stream_options',
  'tools',
  'tool_choice',
  'user',
  'n',
]);
const MESSAGE_MEMBERS = new Set(['role', 'content', 'tool_calls', 'tool_call_id', 'refusal']);
const DATA_URL = /^data:([^;,]+);base64,(.*)$/s;

export function readOpenAIRequest(body: JsonObject, problems: Untranslatable): ChatRequest {
  problems.unknownMembers(body, REQUEST_MEMBERS, []);
  if (body.n !== undefined && body.n !== null && body.n !== 1) problems.add(['n'], 'only 1 choice can be translated');
  const request: ChatRequest = {
    model: optionalString(body, 'model', [], problems) ?? '',
    messages: [],
    stream: body.stream === true,
  };
  const maxTokens = optionalNumber(body, 'max_completion_tokens', [], problems) ?? optionalNumber(body, 'max_tokens', [], problems);
  if (maxTokens !== undefined) request.maxTokens = maxTokens;
  const temperature = optionalNumber(body, 'temperature', [], problems);
  if (temperature !== undefined) request.temperature = temperature;
  const topP = optionalNumber(body, 'top_p', [], problems);
  if (topP !== undefined) request.topP = topP;
  if (typeof body.stop === 'string') request.stop = [body.stop];
  else if (Array.isArray(body.stop)) request.stop = body.stop.filter((s): s is string => typeof s === 'string');
  if (isObject(body.stream_options)) {
    problems.unknownMembers(body.stream_options, new Set(['include_usage']), ['stream_options']);
    if (body.stream_options.include_usage === true) request.streamUsage = true;
  }
  const user = optionalString(body, 'user', [], problems);
  if (user !== undefined) request.user = user;
  readMessages(arrayOf(body, 'messages', [], problems), request, problems);
  const tools = arrayOf(body, 'tools', [], problems).map((tool, i) => readTool(tool, ['tools', i], problems));
  if (tools.length > 0) request.tools = tools;
  if (body.tool_choice !== undefined && body.tool_choice !== null) request.toolChoice = readToolChoice(body.tool_choice, problems);
  return request;
}

function readMessages(messages: unknown[], request: ChatRequest, problems: Untranslatable): void {
  const system: string[] = [];
  messages.forEach((raw, i) => {
    const path = ['messages', i];
    if (!isObject(raw)) return problems.add(path, 'must be an object');
    problems.unknownMembers(raw, MESSAGE_MEMBERS, path);
    const role = raw.role;
    if (role === 'system' || role === 'developer') {
      if (request.messages.length > 0) return problems.add([...path, 'role'], 'a system message can only come before the conversation');
      system.push(textContent(raw.content, [...path, 'content'], problems));
      return;
    }
    if (role === 'user') return void request.messages.push({ role: 'user', parts: readUserContent(raw.content, [...path, 'content'], problems) });
    if (role === 'assistant') return void request.messages.push({ role: 'assistant', parts: readAssistant(raw, path, problems) });
    if (role === 'tool') {
      const callId = optionalString(raw, 'tool_call_id', path, problems) ?? '';
      const part: Part = { type: 'tool_result', callId, content: textContent(raw.content, [...path, 'content'], problems), isError: false };
      const last = request.messages.at(-1);
      // Consecutive tool answers belong to one user turn in the other formats.
      if (last?.role === 'user' && last.parts.every((p) => p.type === 'tool_result')) last.parts.push(part);
      else request.messages.push({ role: 'user', parts: [part] });
      return;
    }
    problems.add([...path, 'role'], `role ${JSON.stringify(role)} is not supported by the rewrite proxy`);
  });
  if (system.length > 0) request.system = system.join('\n\n');
}

function textContent(content: unknown, path: (string | number)[], problems: Untranslatable): string {
  if (typeof content === 'string') return content;
  if (content === null || content === undefined) return '';
  if (!Array.isArray(content)) {
    problems.add(path, 'must be a string or an array of text parts');
    return '';
  }
  return content
    .map((part, i) => {
      if (isObject(part) && part.type === 'text' && typeof part.text === 'string') return part.text;
      problems.add([...path, i], 'only text parts can be translated here');
      return '';
    })
    .join('');
}

function readUserContent(content: unknown, path: (string | number)[], problems: Untranslatable): Part[] {
  if (typeof content === 'string') return [{ type: 'text', text: content }];
  if (!Array.isArray(content)) {
    problems.add(path, 'must be a string or an array of parts');
    return [];
  }
  const parts: Part[] = [];
  content.forEach((part, i) => {
    if (isObject(part) && part.type === 'text' && typeof part.text === 'string') {
      problems.unknownMembers(part, new Set(['type', 'text']), [...path, i]);
      parts.push({ type: 'text', text: part.text });
    } else if (isObject(part) && part.type === 'image_url' && isObject(part.image_url) && typeof part.image_url.url === 'string') {
      problems.unknownMembers(part, new Set(['type', 'image_url']), [...path, i]);
      problems.unknownMembers(part.image_url, new Set(['url']), [...path, i, 'image_url']);
      parts.push({ type: 'image', source: imageSource(part.image_url.url) });
    } else {
      problems.add([...path, i], 'only text and image_url parts can be translated');
    }
  });
  return parts;
}

/** An OpenAI image URL (Chat Completions and Responses alike): inline base64 from a data URL, else the URL. */
export function imageSource(url: string): ImageSource {
  const data = DATA_URL.exec(url);
  return data ? { kind: 'base64', mediaType: data[1]!, data: data[2]! } : { kind: 'url', url };
}

function readAssistant(raw: JsonObject, path: (string | number)[], problems: Untranslatable): Part[] {
  const parts: Part[] = [];
  const text = textContent(raw.content, [...path, 'content'], problems);
  if (text !== '') parts.push({ type: 'text', text });
  if (raw.refusal !== undefined && raw.refusal !== null) problems.add([...path, 'refusal'], 'is not supported by the rewrite proxy');
  arrayOf(raw, 'tool_calls', path, problems).forEach((call, i) => {
    const at = [...path, 'tool_calls', i];
    if (!isObject(call) || !isObject(call.function)) return problems.add(at, 'must be a function call');
    problems.unknownMembers(call, new Set(['id', 'type', 'function']), at);
    const args = optionalString(call.function, 'arguments', [...at, 'function'], problems) ?? '';
    parts.push({
      type: 'tool_call',
      call: {
        id: optionalString(call, 'id', at, problems) ?? '',
        name: optionalString(call.function, 'name', [...at, 'function'], problems) ?? '',
        arguments: parseArguments(args, [...at, 'function', 'arguments'], problems),
      },
    });
  });
  return parts;
}

function readTool(tool: unknown, path: (string | number)[], problems: Untranslatable): Tool {
  if (!isObject(tool) || tool.type !== 'function' || !isObject(tool.function)) {
    problems.add(path, 'only function tools can be translated');
    return { name: '', parameters: {} };
  }
  problems.unknownMembers(tool, new Set(['type', 'function']), path);
  problems.unknownMembers(tool.function, new Set(['name', 'description', 'parameters']), [...path, 'function']);
  const description = optionalString(tool.function, 'description', [...path, 'function'], problems);
  return compact({
    name: optionalString(tool.function, 'name', [...path, 'function'], problems) ?? '',
    description,
    parameters: isObject(tool.function.parameters) ? tool.function.parameters : { type: 'object', properties: {} },
  });
}

function readToolChoice(choice: unknown, problems: Untranslatable): ToolChoice {
  if (choice === 'auto' || choice === 'none' || choice === 'required') return { type: choice };
  if (isObject(choice) && choice.type === 'function' && isObject(choice.function) && typeof choice.function.name === 'string') {
    return { type: 'tool', name: choice.function.name };
  }
  problems.add(['tool_choice'], 'must be auto, none, required or a function');
  return { type: 'auto' };
}

/** The request as OpenAI's Chat Completions API takes it. */
export function writeOpenAIRequest(request: ChatRequest, problems: Untranslatable): JsonObject {
  if (request.topK !== undefined) problems.add(['top_k'], 'OpenAI has no top_k');
  const messages: JsonObject[] = [];
  if (request.system !== undefined) messages.push({ role: 'system', content: request.system });
  request.messages.forEach((message, i) => messages.push(...writeMessage(message, ['messages', i], problems)));
  return compact({
    model: request.model,
    messages,
    max_completion_tokens: request.maxTokens,
    temperature: request.temperature,
    top_p: request.topP,
    stop: request.stop,
    stream: request.stream || undefined,
    stream_options: request.streamUsage ? { include_usage: true } : undefined,
    tools: request.tools?.map((tool) => ({ type: 'function', function: compact({ name: tool.name, description: tool.description, parameters: tool.parameters }) })),
    tool_choice: request.toolChoice ? writeToolChoice(request.toolChoice) : undefined,
    user: request.user,
  });
}

function writeMessage(message: Message, path: (string | number)[], problems: Untranslatable): JsonObject[] {
  if (message.role === 'assistant') {
    const text = message.parts.map((p) => (p.type === 'text' ? p.text : '')).join('');
    const calls = message.parts.flatMap((p) => (p.type === 'tool_call' ? [p.call] : []));
    return [
      compact({
        role: 'assistant',
        content: text === '' && calls.length > 0 ? null : text,
        tool_calls: calls.length > 0 ? calls.map((c) => ({ id: c.id, type: 'function', function: { name: c.name, arguments: JSON.stringify(c.arguments) } })) : undefined,
      }),
    ];
  }
  const out: JsonObject[] = [];
  const content: JsonObject[] = [];
  for (const part of message.parts) {
    if (part.type === 'tool_result') {
      if (part.isError) problems.add(path, 'OpenAI has no way to mark a tool result as an error (is_error)');
      out.push({ role: 'tool', tool_call_id: part.callId, content: part.content });
    }
    else if (part.type === 'text') content.push({ type: 'text', text: part.text });
    else if (part.type === 'image') content.push({ type: 'image_url', image_url: { url: imageUrl(part.source) } });
  }
  if (content.length > 0) {
    const only = content.length === 1 ? content[0] : undefined;
    out.push({ role: 'user', content: only?.type === 'text' ? only.text : content });
  }
  return out;
}

function imageUrl(source: ImageSource): string {
  return source.kind === 'url' ? source.url : `data:${source.mediaType};base64,${source.data}`;
}

function writeToolChoice(choice: ToolChoice): unknown {
  return choice.type === 'tool' ? { type: 'function', function: { name: choice.name } } : choice.type;
}
