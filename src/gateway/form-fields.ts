/**
 * The text fields of a multipart/form-data body (an audio upload's `model`, `response_format`,
 * `stream`), read in place: file parts are stepped over by searching for the next boundary
 * (Buffer.indexOf, no copy of the upload), and the read is bounded in parts, header size and field
 * size, so a crafted body costs at most one scan of bytes the server already holds.
 */

/** One text field, with where its value sits in the body (to replace it: see replaceFieldValue). */
export type FormField = { name: string; value: string; start: number; end: number };

const MAX_PARTS = 100;
const MAX_HEADER_BYTES = 8 * 1024;
const MAX_FIELD_BYTES = 64 * 1024;

/** The body's boundary, from `multipart/form-data; boundary=…`; null for any other content type. */
export function multipartBoundary(contentType: string | undefined): string | null {
  if (!contentType || !/^multipart\/form-data\b/i.test(contentType.trim())) return null;
  const match = /;\s*boundary=(?:"([^"]{1,200})"|([^\s;]{1,200}))/i.exec(contentType);
  return match?.[1] ?? match?.[2] ?? null;
}

/** The text fields, in order; what cannot be read as multipart ends the list. */
export function formFields(body: Buffer, boundary: string): FormField[] {
  const delimiter = Buffer.from(`--${boundary}`);
  const nextDelimiter = Buffer.from(`\r\n--${boundary}`);
  const fields: FormField[] = [];
  let at = body.indexOf(delimiter);
  for (let parts = 0; at !== -1 && parts < MAX_PARTS; parts++) {
    const afterDelimiter = at + delimiter.length;
    // `--boundary--` closes the body; anything but a line end after a boundary is not multipart.
    if (body[afterDelimiter] !== 0x0d || body[afterDelimiter + 1] !== 0x0a) break;
    const headersStart = afterDelimiter + 2;
    const headersEnd = body.subarray(headersStart, headersStart + MAX_HEADER_BYTES).indexOf('\r\n\r\n');
    if (headersEnd === -1) break;
    const disposition = dispositionOf(body.toString('latin1', headersStart, headersStart + headersEnd));
    const valueStart = headersStart + headersEnd + 4;
    if (disposition?.file === false) {
      const valueEnd = body.subarray(valueStart, valueStart + MAX_FIELD_BYTES + nextDelimiter.length).indexOf(nextDelimiter);
      if (valueEnd === -1) break;
      fields.push({ name: disposition.name, value: body.toString('utf8', valueStart, valueStart + valueEnd), start: valueStart, end: valueStart + valueEnd });
      at = valueStart + valueEnd + 2;
    } else {
      // A file (or a part without a name): stepped over, never copied.
      const next = body.indexOf(nextDelimiter, valueStart);
      at = next === -1 ? -1 : next + 2;
    }
  }
  return fields;
}

/** A multipart upload's text fields as an object (an audio upload names its model in one); undefined for another body. */
export function uploadFields(contentType: string | undefined, body: Buffer | undefined): Record<string, string> | undefined {
  const boundary = multipartBoundary(contentType);
  return body && boundary ? fieldsObject(formFields(body, boundary)) : undefined;
}

/** The fields as an object (the first of a repeated name wins), as the provider modules read bodies. */
export function fieldsObject(fields: readonly FormField[]): Record<string, string> {
  const object: Record<string, string> = {};
  for (const field of fields) if (!(field.name in object)) object[field.name] = field.value;
  return object;
}

/** The body with one field's value replaced, every other byte as it was. */
export function replaceFieldValue(body: Buffer, field: FormField, value: string): Buffer {
  return Buffer.concat([body.subarray(0, field.start), Buffer.from(value, 'utf8'), body.subarray(field.end)]);
}

/** `form-data; name="model"` → {name, file: false}; a `filename` makes it a file; null without a name. */
function dispositionOf(headers: string): { name: string; file: boolean } | null {
  const line = headers.split('\r\n').find((header) => /^content-disposition\s*:/i.test(header));
  if (!line) return null;
  const name = /;\s*name="([^"]*)"/i.exec(line)?.[1] ?? /;\s*name=([^\s;]+)/i.exec(line)?.[1];
  if (name === undefined) return null;
  return { name, file: /;\s*filename\*?=/i.test(line) };
}
