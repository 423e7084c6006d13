import tseslint from 'typescript-eslint';

/** What may import a service, and what nothing below the services imports. */
const ENTRY_LAYERS = ['routes', 'web', 'cli', 'gateway', 'app.ts', 'main.ts'];
const ABOVE_COMMERCE = [...ENTRY_LAYERS, 'services'];
const ABOVE_LEDGER = [...ABOVE_COMMERCE, 'commerce', 'http', 'providers', 'payments'];
const ABOVE_WEBHOOKS = [...ABOVE_LEDGER, 'ledger'];
const ABOVE_STORAGE = [...ABOVE_WEBHOOKS, 'webhooks', 'app-deps.ts'];

export default tseslint.config(
  { ignores: ['node_modules/', 'data/', 'dist/', 'coverage/', 'bench/results/'] },
  ...tseslint.configs.recommended,
  {
    rules: {
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
      '@typescript-eslint/no-non-null-assertion': 'off',
      'no-console': 'off',
    },
  },
  // Layers point down (docs/architecture.md): routes, gateway, web, cli → services → commerce →
  // ledger → webhooks (the outbox) → storage → domain, with payments below commerce and http/ the
  // shared request helpers (errors, auth, pagination) that any layer above storage may use. A lower
  // layer that imports a higher one fails the lint (decisions 0020 and 0035). The type AppDeps lives
  // in src/app-deps.ts so that naming it imports no layer. Import circles are refused by
  // test/unit/import-graph.test.ts.
  layer('src/domain/**', ['..'], 'domain is pure: it imports only domain modules'),
  layer('src/storage/**', [...ABOVE_STORAGE], 'storage imports only storage and domain: events are written by the services and commerce that make the change'),
  layer('src/webhooks/**', [...ABOVE_WEBHOOKS], 'webhooks import only webhooks, storage and domain'),
  layer('src/ledger/**', [...ABOVE_LEDGER], 'the ledger imports only ledger, the events outbox, storage and domain'),
  layer('src/payments/**', ['storage', 'webhooks', ...ABOVE_LEDGER], 'payments import only payments, domain and the config'),
  layer('src/commerce/**', [...ABOVE_COMMERCE, 'http'], 'commerce imports ledger, payments, webhooks, storage and domain, never services, routes or pages'),
  layer('src/http/**', [...ABOVE_COMMERCE, 'commerce', 'payments', 'ledger', 'webhooks', 'app-deps.ts'], 'http/ (the shared request helpers) imports only storage and domain'),
  layer('src/services/**', ENTRY_LAYERS, 'services sit below routes, pages and the CLI: they never import them'),
  layer('src/routes/**', ['web', 'cli', 'app.ts', 'main.ts', './*'], 'a route calls services (or storage for a plain read), never another route module or a page'),
  layer('src/web/**', ['routes', 'gateway', 'cli', 'app.ts', 'main.ts'], 'pages call services (and storage for plain reads), never route modules'),
  // Time comes from the one injected clock (src/domain/clock.ts, AppDeps.clock), so a test moves it
  // instead of waiting for it: nothing else in src/ reads the system clock (decision 0032).
  {
    files: ['src/**'],
    ignores: [
      'src/domain/clock.ts',
    ],
    rules: {
      'no-restricted-syntax': [
        'error',
        { selector: "NewExpression[callee.name='Date'][arguments.length=0]", message: 'Take the time from the injected clock (dateOf(clock)), not new Date().' },
        { selector: "CallExpression[callee.object.name='Date'][callee.property.name='now']", message: 'Take the time from the injected clock (clock.now()), not Date.now().' },
      ],
    },
  },
);

/** A directory whose files may not import from the given higher layers (relative imports, any depth). */
function layer(files, forbidden, message) {
  const group = forbidden.flatMap((name) => (name === '..' || name === './*' ? [name === '..' ? '../*' : name] : [`**/${name}`, `**/${name}/*`]));
  return { files: [files], rules: { 'no-restricted-imports': ['error', { patterns: [{ group, message }] }] } };
}
