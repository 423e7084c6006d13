import { describe, expect, it } from 'vitest';
import { formFields, replaceFieldValue } from '../../src/gateway/form-fields.ts';

/**
 * The multipart text-field reader is bounded as decision 0027 says: at most 100 parts, 8 KiB of
 * part headers and 64 KiB a field; what passes a bound ends the list instead of being read.
 */
const BOUNDARY = 'b0und4ry';

type Part = { name: string; value: string; filename?: string; extraHeader?: string };

function multipart(parts: Part[]): Buffer {
  const pieces = parts.map((p) => {
    const disposition = `Content-Disposition: form-data; name="${p.name}"${p.filename ? `; filename="${p.filename}"` : ''}`;
    return `--${BOUNDARY}\r\n${disposition}\r\n${p.extraHeader ?? ''}\r\n${p.value}\r\n`;
  });
  return Buffer.from(`${pieces.join('')}--${BOUNDARY}--\r\n`);
}

const names = (body: Buffer) => formFields(body, BOUNDARY).map((f) => f.name);

describe('multipart form fields', () => {
  it('reads text fields in order and steps over file parts', () => {
    const body = multipart([
      { name: 'file', value: 'RIFF....binary', filename: 'a.wav' },
      { name: 'model', value: 'whisper-1' },
      { name: 'response_format', value: 'json' },
    ]);
    const fields = formFields(body, BOUNDARY);
    expect(fields.map((f) => [f.name, f.value])).toEqual([
      ['model', 'whisper-1'],
      ['response_format', 'json'],
    ]);
    expect(replaceFieldValue(body, fields[0]!, 'gpt-4o-transcribe').toString()).toBe(body.toString().replace('whisper-1', 'gpt-4o-transcribe'));
  });

  it('reads at most 100 parts', () => {
    const parts = Array.from({ length: 101 }, (_, i) => ({ name: `f${i}`, value: 'v' }));
    expect(names(multipart(parts))).toEqual(parts.slice(0, 100).map((p) => p.name));
  });

  it('a field value over 64 KiB ends the list; one of exactly 64 KiB is read', () => {
    const atLimit = multipart([{ name: 'model', value: 'm'.repeat(64 * 1024) }, { name: 'after', value: 'x' }]);
    expect(names(atLimit)).toEqual(['model', 'after']);
    const over = multipart([{ name: 'before', value: 'x' }, { name: 'model', value: 'm'.repeat(64 * 1024 + 1) }, { name: 'after', value: 'x' }]);
    expect(names(over)).toEqual(['before']);
  });

  it('part headers over 8 KiB end the list', () => {
    const padding = (n: number) => `X-Pad: ${'p'.repeat(n)}\r\n`;
    const within = multipart([{ name: 'model', value: 'm', extraHeader: padding(7 * 1024) }]);
    expect(names(within)).toEqual(['model']);
    const over = multipart([{ name: 'before', value: 'x' }, { name: 'model', value: 'm', extraHeader: padding(8 * 1024) }]);
    expect(names(over)).toEqual(['before']);
  });
});
