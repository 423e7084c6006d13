/**
 * Anthropic Messages requests, read into and written from the canonical shape. Anthropic requires
 * `max_tokens`; a request from a format where it is optional gets DEFAULT_MAX_TOKENS.
 */
import {
  arrayOf,
  compact,
  isObject,
  optionalNumber,
  optionalString,
  Untranslatable,
  type ChatRequest,
  type ImageSource,
  type JsonObject,
  type Message,
  type Part,
  type Tool,
  type ToolChoice,
} from './canonical.ts';

/** What an Anthropic request gets when the client's format left the output cap open. */
const DEFAULT_MAX_TOKENS = 4096;

const REQUEST_MEMBERS = new Set([
  'model',
  'messages',
  'system',
  'max_tokens',
  'temperature',
  'top_p',
  'top_k',
  'stop_sequences',
  'stream',
  'tools',
  'tool_choice',
  'metadata',
]);

export function readAnthropicRequest(body: JsonObject, problems: Untranslatable): ChatRequest {
  problems.unknownMembers(body, REQUEST_MEMBERS, []);
  const request: ChatRequest = {
    model: optionalString(body, 'model', [], problems) ?? '',
    messages: [],
    stream: body.stream === true,
  };
  const numbers = [
    ['max_tokens', 'maxTokens'],
    ['temperature', 'temperature'],
    ['top_p', 'topP'],
    ['top_k', 'topK'],
  ] as const;
  for (const [member, field] of numbers) {
    const value = optionalNumber(body, member, [], problems);
    if (value !== undefined) request[field] = value;
  }
  const stop = arrayOf(body, 'stop_sequences', [], problems).filter((s): s is string => typeof s === 'string');
  if (stop.length > 0) request.stop = stop;
  if (body.system !== undefined) request.system = systemText(body.system, problems);
  if (isObject(body.metadata)) {
    problems.unknownMembers(body.metadata, new Set(['user_id']), ['metadata']);
    const user = optionalString(body.metadata, 'user_id', ['metadata'], problems);
    if (user !== undefined) request.user = user;
  }
  arrayOf(body, 'messages', [], problems).forEach((raw, i) => {
    const message = readMessage(raw, ['messages', i], problems);
    if (message) request.messages.push(message);
  });
  const tools = arrayOf(body, 'tools', [], problems).map((tool, i) => readTool(tool, ['tools', i], problems));
  if (tools.length > 0) request.tools = tools;
  if (body.tool_choice !== undefined) request.toolChoice = readToolChoice(body.tool_choice, problems);
  return request;
}

function systemText(system: unknown, problems: Untranslatable): string {
  if (typeof system === 'string') return system;
  if (!Array.isArray(system)) {
    problems.add(['system'], 'must be a string or text blocks');
    return '';
  }
  return system
    .map((block, i) => {
      if (!isObject(block) || block.type !== 'text' || typeof block.text !== 'string') {
        problems.add(['system', i], 'only text blocks can be translated');
        return '';
      }
      problems.unknownMembers(block, new Set(['type', 'text']), ['system', i]);
      return block.text;
    })
    .join('\n\n');
}

function readMessage(raw: unknown, path: (string | number)[], problems: Untranslatable): Message | undefined {
  if (!isObject(raw) || (raw.role !== 'user' && raw.role !== 'assistant')) {
    problems.add(path, 'must be a user or assistant message');
    return undefined;
  }
  problems.unknownMembers(raw, new Set(['role', 'content']), path);
  if (typeof raw.content === 'string') return { role: raw.role, parts: [{ type: 'text', text: raw.content }] };
  const parts = arrayOf(raw, 'content', path, problems).flatMap((block, i) => readBlock(block, [...path, 'content', i], problems));
  return { role: raw.role, parts };
}

function readBlock(block: unknown, path: (string | number)[], problems: Untranslatable): Part[] {
  if (!isObject(block)) {
    problems.add(path, 'must be a content block');
    return [];
  }
  switch (block.type) {
    case 'text':
      problems.unknownMembers(block, new Set(['type', 'text']), path);
      return [{ type: 'text', text: optionalString(block, 'text', path, problems) ?? '' }];
    case 'image': {
      problems.unknownMembers(block, new Set(['type', 'source']), path);
      const source = readImageSource(block.source, [...path, 'source'], problems);
      return source ? [{ type: 'image', source }] : [];
    }
    case 'tool_use':
      problems.unknownMembers(block, new Set(['type', 'id', 'name', 'input']), path);
      return [
        {
          type: 'tool_call',
          call: {
            id: optionalString(block, 'id', path, problems) ?? '',
            name: optionalString(block, 'name', path, problems) ?? '',
            arguments: isObject(block.input) ? block.input : {},
          },
        },
      ];
    case 'tool_result':
      problems.unknownMembers(block, new Set(['type', 'tool_use_id', 'content', 'is_error']), path);
      return [
        {
          type: 'tool_result',
          callId: optionalString(block, 'tool_use_id', path, problems) ?? '',
          content: toolResultText(block.content, [...path, 'content'], problems),
          isError: block.is_error === true,
        },
      ];
    default:
      problems.add([...path, 'type'], `content block type ${JSON.stringify(block.type)} is not supported by the rewrite proxy`);
      return [];
  }
}

function readImageSource(source: unknown, path: (string | number)[], problems: Untranslatable): ImageSource | undefined {
  if (isObject(source) && source.type === 'base64' && typeof source.media_type === 'string' && typeof source.data === 'string') {
    problems.unknownMembers(source, new Set(['type', 'media_type', 'data']), path);
    return { kind: 'base64', mediaType: source.media_type, data: source.data };
  }
  if (isObject(source) && source.type === 'url' && typeof source.url === 'string') {
    problems.unknownMembers(source, new Set(['type', 'url']), path);
    return { kind: 'url', url: source.url };
  }
  problems.add(path, 'only base64 and url image sources can be translated');
  return undefined;
}

function toolResultText(content: unknown, path: (string | number)[], problems: Untranslatable): string {
  if (content === undefined || typeof content === 'string') return content ?? '';
  if (!Array.isArray(content)) {
    problems.add(path, 'must be a string or text blocks');
    return '';
  }
  return content
    .map((block, i) => {
      if (isObject(block) && block.type === 'text' && typeof block.text === 'string') return block.text;
      problems.add([...path, i], 'only text blocks can be translated');
      return '';
    })
    .join('');
}

function readTool(tool: unknown, path: (string | number)[], problems: Untranslatable): Tool {
  if (!isObject(tool) || (tool.type !== undefined && tool.type !== 'custom')) {
    problems.add(path, 'only custom tools (name, description, input_schema) can be translated');
    return { name: '', parameters: {} };
  }
  problems.unknownMembers(tool, new Set(['type', 'name', 'description', 'input_schema']), path);
  return compact({
    name: optionalString(tool, 'name', path, problems) ?? '',
    description: optionalString(tool, 'description', path, problems),
    parameters: isObject(tool.input_schema) ? tool.input_schema : { type: 'object', properties: {} },
  });
}

function readToolChoice(choice: unknown, problems: Untranslatable): ToolChoice {
  if (isObject(choice)) {
    problems.unknownMembers(choice, new Set(['type', 'name']), ['tool_choice']);
    if (choice.type === 'auto' || choice.type === 'none') return { type: choice.type };
    if (choice.type === 'any') return { type: 'required' };
    if (choice.type === 'tool' && typeof choice.name === 'string') return { type: 'tool', name: choice.name };
  }
  problems.add(['tool_choice'], 'must be auto, any, none or a tool');
  return { type: 'auto' };
}

/** The request as Anthropic's Messages API takes it. */
export function writeAnthropicRequest(request: ChatRequest): JsonObject {
  return compact({
    model: request.model,
    max_tokens: request.maxTokens ?? DEFAULT_MAX_TOKENS,
    system: request.system,
    messages: request.messages.map(writeMessage),
    temperature: request.temperature,
    top_p: request.topP,
    top_k: request.topK,
    stop_sequences: request.stop,
    stream: request.stream || undefined,
    tools: request.tools?.map((tool) => compact({ name: tool.name, description: tool.description, input_schema: tool.parameters })),
    tool_choice: request.toolChoice ? writeToolChoice(request.toolChoice) : undefined,
    metadata: request.user !== undefined ? { user_id: request.user } : undefined,
  });
}

function writeMessage(message: Message): JsonObject {
  const only = message.parts.length === 1 ? message.parts[0] : undefined;
  if (only?.type === 'text') return { role: message.role, content: only.text };
  return { role: message.role, content: message.parts.map(writeBlock) };
}

function writeBlock(part: Part): JsonObject {
  switch (part.type) {
    case 'text':
      return { type: 'text', text: part.text };
    case 'image':
      return {
        type: 'image',
        source: part.source.kind === 'url' ? { type: 'url', url: part.source.url } : { type: 'base64', media_type: part.source.mediaType, data: part.source.data },
      };
    case 'tool_call':
      return { type: 'tool_use', id: part.call.id, name: part.call.name, input: part.call.arguments };
    case 'tool_result':
      return compact({ type: 'tool_result', tool_use_id: part.callId, content: part.content, is_error: part.isError || undefined });
  }
}

function writeToolChoice(choice: ToolChoice): JsonObject {
  if (choice.type === 'required') return { type: 'any' };
  return choice.type === 'tool' ? { type: 'tool', name: choice.name } : { type: choice.type };
}
