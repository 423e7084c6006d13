import { describe, expect, it } from 'vitest';
import { Untranslatable, type StreamEvent } from '../../src/gateway/rewrite/canonical.ts';
import { readResponsesRequest } from '../../src/gateway/rewrite/responses-request.ts';
import { createResponsesStreamEncoder, writeResponsesResponse } from '../../src/gateway/rewrite/responses-response.ts';
import { translateRequest } from '../../src/gateway/rewrite/translate.ts';

/** The Responses API's reader and writers, case by case (the e2e tests drive them through the SDKs). */

function read(body: Record<string, unknown>) {
  const problems = new Untranslatable();
  const request = readResponsesRequest(body, problems);
  return { request, issues: problems.issues };
}

describe('reading a Responses request', () => {
  it('takes instructions and leading system and developer messages as the one system prompt', () => {
    const { request, issues } = read({
      model: 'm',
      instructions: 'first',
      input: [
        { role: 'developer', content: 'second' },
        { type: 'message', role: 'system', content: [{ type: 'input_text', text: 'third' }] },
        { role: 'user', content: 'hi' },
      ],
    });
    expect(issues).toEqual([]);
    expect(request.system).toBe('first\n\nsecond\n\nthird');
    expect(request.messages).toEqual([{ role: 'user', parts: [{ type: 'text', text: 'hi' }] }]);
  });

  it('keeps an earlier answer (output_text) and its calls in one assistant turn, and consecutive outputs in one user turn', () => {
    const { request, issues } = read({
      model: 'm',
      input: [
        { role: 'user', content: [{ type: 'input_text', text: 'q' }, { type: 'input_image', image_url: 'data:image/png;base64,AAAA', detail: 'auto' }] },
        { type: 'message', role: 'assistant', id: 'msg_1', status: 'completed', content: [{ type: 'output_text', text: 'let me look', annotations: [] }] },
        { type: 'function_call', id: 'fc_1', call_id: 'c1', name: 'a', arguments: '{"x":1}', status: 'completed' },
        { type: 'function_call', call_id: 'c2', name: 'b', arguments: '' },
        { type: 'function_call_output', call_id: 'c1', output: 'one' },
        { type: 'function_call_output', call_id: 'c2', output: [{ type: 'input_text', text: 'two' }] },
      ],
    });
    expect(issues).toEqual([]);
    expect(request.messages).toEqual([
      { role: 'user', parts: [{ type: 'text', text: 'q' }, { type: 'image', source: { kind: 'base64', mediaType: 'image/png', data: 'AAAA' } }] },
      {
        role: 'assistant',
        parts: [
          { type: 'text', text: 'let me look' },
          { type: 'tool_call', call: { id: 'c1', name: 'a', arguments: { x: 1 } } },
          { type: 'tool_call', call: { id: 'c2', name: 'b', arguments: {} } },
        ],
      },
      {
        role: 'user',
        parts: [
          { type: 'tool_result', callId: 'c1', content: 'one', isError: false },
          { type: 'tool_result', callId: 'c2', content: 'two', isError: false },
        ],
      },
    ]);
  });

  it('reads the output cap, sampling, user, tools and tool choice', () => {
    const { request, issues } = read({
      model: 'm',
      input: 'hi',
      max_output_tokens: 7,
      temperature: 0.5,
      top_p: 0.9,
      user: 'u1',
      store: false,
      parallel_tool_calls: true,
      text: { format: { type: 'text' } },
      tools: [{ type: 'function', name: 'f', description: 'd', parameters: { type: 'object' }, strict: false }],
      tool_choice: { type: 'function', name: 'f' },
    });
    expect(issues).toEqual([]);
    expect(request).toMatchObject({ maxTokens: 7, temperature: 0.5, topP: 0.9, user: 'u1', tools: [{ name: 'f', description: 'd', parameters: { type: 'object' } }], toolChoice: { type: 'tool', name: 'f' } });
  });

  it('names everything it cannot translate', () => {
    const { issues } = read({
      model: 'm',
      previous_response_id: 'resp_1',
      reasoning: { effort: 'low' },
      store: true,
      parallel_tool_calls: false,
      text: { format: { type: 'json_schema', name: 's', schema: {} } },
      input: [
        { type: 'reasoning', id: 'rs_1', summary: [] },
        { role: 'user', content: [{ type: 'input_file', file_id: 'file_1' }] },
        { role: 'user', content: 'later' },
        { role: 'system', content: 'too late' },
      ],
      tools: [{ type: 'web_search' }, { type: 'function', name: 'f', parameters: {}, strict: true }],
    });
    expect(issues.map((issue) => issue.path.join('.'))).toEqual([
      'previous_response_id',
      'reasoning',
      'store',
      'parallel_tool_calls',
      'text.format',
      'input.0.type',
      'input.1.content.0',
      'input.3.role',
      'tools.0',
      'tools.1.strict',
    ]);
  });

  it('is refused as a whole through translateRequest, every field named', () => {
    expect(() => translateRequest('responses', 'anthropic', { model: 'm', input: 'x', conversation: 'c' }, { model: '', stream: false })).toThrow(
      expect.objectContaining({ code: 'untranslatable_request', message: expect.stringContaining('conversation') }),
    );
  });
});

describe('writing a Responses answer', () => {
  it('puts text in a message item and each call in a function_call item; a content filter makes it incomplete', () => {
    const written = writeResponsesResponse(
      {
        id: 'x1',
        model: 'm',
        parts: [
          { type: 'text', text: 'hi' },
          { type: 'tool_call', call: { id: 'c1', name: 'f', arguments: { a: 1 } } },
        ],
        stopReason: 'content_filter',
        usage: { inputTokens: 3, outputTokens: 2, cachedInputTokens: 1 },
      },
      { created: 1 },
    );
    expect(written).toEqual({
      id: 'x1',
      object: 'response',
      created_at: 1,
      status: 'incomplete',
      error: null,
      incomplete_details: { reason: 'content_filter' },
      model: 'm',
      output: [
        { id: 'msg_x1', type: 'message', status: 'completed', role: 'assistant', content: [{ type: 'output_text', text: 'hi', annotations: [] }] },
        { id: 'fc_c1', type: 'function_call', status: 'completed', call_id: 'c1', name: 'f', arguments: '{"a":1}' },
      ],
      parallel_tool_calls: true,
      usage: { input_tokens: 3, input_tokens_details: { cached_tokens: 1 }, output_tokens: 2, output_tokens_details: { reasoning_tokens: 0 }, total_tokens: 5 },
    });
  });

  it('streams text then two calls as three items, each closed before the next opens, and completes with all of them', () => {
    const encode = createResponsesStreamEncoder({ created: 1 });
    const events: StreamEvent[] = [
      { type: 'start', id: 'r', model: 'm' },
      { type: 'text', text: 'a' },
      { type: 'tool_call', index: 0, id: 'c1', name: 'f', argumentsDelta: '' },
      { type: 'tool_call', index: 0, argumentsDelta: '{"x":' },
      { type: 'tool_call', index: 0, argumentsDelta: '1}' },
      { type: 'tool_call', index: 1, id: 'c2', name: 'g', argumentsDelta: '{}' },
      { type: 'finish', stopReason: 'tool_calls' },
      { type: 'usage', usage: { inputTokens: 1, outputTokens: 2 } },
      { type: 'done' },
    ];
    const sse = events.map(encode).join('');
    const parsed = sse
      .split('\n\n')
      .filter(Boolean)
      .map((block) => JSON.parse(block.split('\n').find((line) => line.startsWith('data: '))!.slice(6)) as Record<string, unknown>);
    expect(parsed.map((e) => [e.type, e.output_index ?? null])).toEqual([
      ['response.created', null],
      ['response.in_progress', null],
      ['response.output_item.added', 0],
      ['response.content_part.added', 0],
      ['response.output_text.delta', 0],
      ['response.output_text.done', 0],
      ['response.content_part.done', 0],
      ['response.output_item.done', 0],
      ['response.output_item.added', 1],
      ['response.function_call_arguments.delta', 1],
      ['response.function_call_arguments.delta', 1],
      ['response.function_call_arguments.done', 1],
      ['response.output_item.done', 1],
      ['response.output_item.added', 2],
      ['response.function_call_arguments.delta', 2],
      ['response.function_call_arguments.done', 2],
      ['response.output_item.done', 2],
      ['response.completed', null],
    ]);
    expect(parsed.map((e) => e.sequence_number)).toEqual(parsed.map((_, i) => i));
    expect(parsed.at(-1)).toMatchObject({
      response: {
        status: 'completed',
        output: [
          { type: 'message', content: [{ text: 'a' }] },
          { type: 'function_call', call_id: 'c1', name: 'f', arguments: '{"x":1}' },
          { type: 'function_call', call_id: 'c2', name: 'g', arguments: '{}' },
        ],
        usage: { input_tokens: 1, output_tokens: 2, total_tokens: 3 },
      },
    });
  });
});
