/**
 * A stand-in for an object a hook makes later (a beforeAll's app or mock provider, a beforeEach's
 * customer): every property read goes to what `current()` returns at that moment, so a describe
 * block can hand it to its tests before the hook has run, and a test reads the object of its own
 * run. Methods are bound to the object itself. Only reads pass through (no spreading, no writes);
 * a read before the object exists throws, naming it.
 */
export function live<T extends object>(name: string, current: () => T | undefined): T {
  return new Proxy({} as T, {
    get(_target, key) {
      const object = current();
      if (object === undefined) throw new Error(`${name} is made in a hook that has not run yet: read it in a test or a later hook`);
      const value: unknown = Reflect.get(object, key);
      return typeof value === 'function' ? value.bind(object) : value;
    },
  });
}
