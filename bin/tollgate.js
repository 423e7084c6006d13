#!/usr/bin/env node
// Runs the compiled CLI from dist/ (built by `npm install` through the `prepare` script) when it is
// at least as new as every source file; otherwise the TypeScript sources through tsx, so an edit
// never runs stale code and a checkout without a build still works. The compiled form starts
// faster and leaves out tsx's loader thread (about 40 MB of resident memory).
import { readdirSync, statSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('..', import.meta.url));
const stamp = `${root}dist/.built`;

function newestSourceMtime(dir) {
  let newest = 0;
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = `${dir}/${entry.name}`;
    newest = Math.max(newest, entry.isDirectory() ? newestSourceMtime(path) : statSync(path).mtimeMs);
  }
  return newest;
}

function compiledIsFresh() {
  try {
    return statSync(stamp).mtimeMs >= newestSourceMtime(`${root}src`);
  } catch {
    return false;
  }
}

if (compiledIsFresh()) {
  await import('../dist/cli/index.js');
} else {
  const { register } = await import('tsx/esm/api');
  register();
  await import('../src/cli/index.ts');
}
