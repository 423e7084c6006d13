import { ApiError } from './errors.ts';

/**
 * The deepest nesting of objects and arrays accepted in a JSON body (ours or a forwarded one).
 * Real requests stay far below it; without a bound a small body nested thousands deep costs
 * every later walk over it CPU and stack (decision 0019).
 */
export const MAX_JSON_DEPTH = 64;

const OPEN_BRACE = 0x7b;
const OPEN_BRACKET = 0x5b;
const CLOSE_BRACE = 0x7d;
const CLOSE_BRACKET = 0x5d;
const QUOTE = 0x22;
const BACKSLASH = 0x5c;

/**
 * True when JSON text nests objects and arrays deeper than `max`. One pass over the characters,
 * skipping strings, so it is checked before parsing; malformed text is left to the parser.
 */
export function jsonNestsDeeperThan(text: string, max: number): boolean {
  let depth = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === BACKSLASH) i++;
      else if (c === QUOTE) inString = false;
    } else if (c === QUOTE) {
      inString = true;
    } else if (c === OPEN_BRACE || c === OPEN_BRACKET) {
      if (++depth > max) return true;
    } else if (c === CLOSE_BRACE || c === CLOSE_BRACKET) {
      depth--;
    }
  }
  return false;
}

/** Refuses JSON text nested deeper than MAX_JSON_DEPTH with 400 `invalid_json`. */
export function assertJsonDepth(text: string): void {
  if (jsonNestsDeeperThan(text, MAX_JSON_DEPTH)) {
    throw new ApiError('invalid_json', `The request body nests objects and arrays deeper than ${MAX_JSON_DEPTH} levels.`);
  }
}
