import tseslint from 'typescript-eslint';

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
  // Layers point down: routes/gateway → ledger → storage → domain. A lower layer that imports a
  // higher one fails the lint (decision 0020).
  layer('src/domain/**', ['..'], 'domain is pure: it imports only domain modules'),
  layer('src/storage/**', ['ledger', 'gateway', 'http', 'routes', 'web', 'commerce', 'providers', 'payments', 'cli', 'app.ts', 'main.ts'], 'storage imports only storage and domain (and the events outbox)'),
  layer('src/ledger/**', ['gateway', 'http', 'routes', 'web', 'commerce', 'providers', 'payments', 'cli', 'app.ts', 'main.ts'], 'the ledger imports only ledger, storage and domain (and the events outbox)'),
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
  const group = forbidden.flatMap((name) => (name === '..' ? ['../*'] : [`**/${name}`, `**/${name}/*`]));
  return { files: [files], rules: { 'no-restricted-imports': ['error', { patterns: [{ group, message }] }] } };
}
