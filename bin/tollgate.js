#!/usr/bin/env node
// Runs the TypeScript CLI directly through tsx, so `npm start` and `npx tollgate` need no build step.
import { register } from 'tsx/esm/api';

register();
await import('../src/cli/index.ts');
