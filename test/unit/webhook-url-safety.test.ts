import { describe, expect, it } from 'vitest';
import { addressProblem, checkedLookup, urlProblem, urlProblemAfterLookup } from '../../src/webhooks/url-safety.ts';

const strict = { allowHttpLoopback: false };
const dev = { allowHttpLoopback: true };

describe('webhook URL safety', () => {
  it.each([
    '127.0.0.1', '127.8.9.10', '10.0.0.1', '172.16.0.1', '172.31.255.255', '192.168.0.1', '169.254.169.254', '0.0.0.0',
    '224.0.0.1', '255.255.255.255', '100.64.0.1', '::1', '::', '::ffff:127.0.0.1', '::ffff:10.0.0.1', 'fe80::1', 'fc00::1', 'fd00:ec2::254', 'ff02::1',
  ])('refuses the address %s', (address) => {
    expect(addressProblem(address, strict)).not.toBeNull();
  });

  it.each(['8.8.8.8', '1.1.1.1', '172.32.0.1', '2606:4700:4700::1111'])('allows the public address %s', (address) => {
    expect(addressProblem(address, strict)).toBeNull();
  });

  it('allows loopback, and only loopback, when the operator allows it for development', () => {
    expect(addressProblem('127.0.0.1', dev)).toBeNull();
    expect(addressProblem('::1', dev)).toBeNull();
    expect(addressProblem('10.0.0.1', dev)).not.toBeNull();
    expect(addressProblem('169.254.169.254', dev)).not.toBeNull();
  });

  it('refuses IPv4-compatible IPv6 hosts, whatever address they carry, and port 0', () => {
    expect(urlProblem('https://[::127.0.0.1]/', strict)).toMatch(/IPv4-compatible/);
    expect(urlProblem('https://[::7f00:1]/', strict)).toMatch(/IPv4-compatible/);
    expect(urlProblem('https://[::10.0.0.1]/', strict)).toMatch(/IPv4-compatible/);
    expect(urlProblem('https://[::8.8.8.8]/', strict)).toMatch(/IPv4-compatible/);
    expect(addressProblem('::7f00:1', dev)).toMatch(/IPv4-compatible/);
    expect(urlProblem('https://example.com:0/hook', strict)).toMatch(/port 0/);
    expect(urlProblem('https://8.8.8.8:0/', strict)).toMatch(/port 0/);
    expect(urlProblem('https://example.com:8443/hook', strict)).toBeNull();
    expect(urlProblem('http://[::1]:3000/', dev)).toBeNull();
  });

  it('reads IP hosts written in other notations as the address they are', () => {
    expect(urlProblem('https://0x7f.1/', strict)).toMatch(/loopback/);
    expect(urlProblem('https://2130706433/', strict)).toMatch(/loopback/);
    expect(urlProblem('https://[::ffff:7f00:1]/', strict)).toMatch(/loopback/);
  });

  it('allows plain http only to a loopback host, and only in development', () => {
    expect(urlProblem('http://localhost:3000/', strict)).toMatch(/https/);
    expect(urlProblem('http://localhost:3000/', dev)).toBeNull();
    expect(urlProblem('http://example.com/', dev)).toMatch(/https/);
    expect(urlProblem('https://example.com/hook', strict)).toBeNull();
  });

  it('refuses a name when any of its addresses is forbidden, and accepts a name that does not resolve yet', async () => {
    const mixed = async () => [{ address: '93.184.216.34', family: 4 }, { address: '10.0.0.7', family: 4 }];
    expect(await urlProblemAfterLookup('https://mixed.example/', strict, mixed)).toMatch(/10\.0\.0\.7/);
    const missing = async () => {
      throw Object.assign(new Error('not found'), { code: 'ENOTFOUND' });
    };
    expect(await urlProblemAfterLookup('https://later.example/', strict, missing)).toBeNull();
  });

  it('hands the socket exactly the addresses it checked, or an error', async () => {
    const lookup = checkedLookup(strict, async () => [{ address: '93.184.216.34', family: 4 }]);
    const got = await new Promise((resolve) => lookup('h.example', { all: true }, (err, addresses) => resolve({ err, addresses })));
    expect(got).toEqual({ err: null, addresses: [{ address: '93.184.216.34', family: 4 }] });
    const refused = checkedLookup(strict, async () => [{ address: '127.0.0.1', family: 4 }]);
    const err = await new Promise((resolve) => refused('h.example', {}, (e) => resolve(e)));
    expect(err).toMatchObject({ code: 'EWEBHOOKFORBIDDEN' });
  });
});
