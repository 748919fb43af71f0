// A real OpenID Connect provider (the certified `oidc-provider` package) on loopback, for
// kbportal's SSO tests (tests/kbportal/test_sso.py starts it with `node server.js`).
//
// Configuration comes from the environment, so each test run declares its own clients and users:
//   KB_OIDC_CLIENTS   JSON list of oidc-provider client metadata
//                     ({client_id, client_secret, redirect_uris, post_logout_redirect_uris, ...})
//   KB_OIDC_ACCOUNTS  JSON object {accountId: {email, email_verified, name}}
//   KB_OIDC_HOST      address to listen on (default 127.0.0.1); the port is chosen by the OS
//
// On start it prints one line `listening <issuer URL>` to stdout. Authorization is the code flow,
// PKCE required for every client. The login step is a minimal interaction instead of a real
// login form: GET /interaction/<uid> shows a form naming the account to sign in as, POST of
// `login=<accountId or email>` signs that account in and grants the requested scopes; with a
// `login_hint` naming a known account the GET signs it in at once.
import { generateKeyPairSync, randomBytes } from 'node:crypto';
import http from 'node:http';

import Provider from 'oidc-provider';

const clients = JSON.parse(process.env.KB_OIDC_CLIENTS || '[]');
const accounts = JSON.parse(process.env.KB_OIDC_ACCOUNTS || '{}');
const host = process.env.KB_OIDC_HOST || '127.0.0.1';

function accountByLogin(login) {
  if (!login) return null;
  const wanted = String(login).trim().toLowerCase();
  for (const [accountId, account] of Object.entries(accounts)) {
    if (accountId.toLowerCase() === wanted || String(account.email || '').toLowerCase() === wanted) {
      return { accountId, ...account };
    }
  }
  return null;
}

function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

function loginForm(uid, message) {
  return `<!doctype html><html><head><title>Test IdP sign-in</title></head><body>
<h1>Test IdP sign-in</h1>${message ? `<p class="error">${escapeHtml(message)}</p>` : ''}
<form method="post" action="/interaction/${escapeHtml(uid)}">
<label>Account <input name="login" autofocus></label><button type="submit">Sign in</button>
</form></body></html>`;
}

function readForm(req) {
  return new Promise((resolve, reject) => {
    let body = '';
    req.setEncoding('utf8');
    req.on('data', (chunk) => {
      body += chunk;
      if (body.length > 10_000) reject(new Error('form body too large'));
    });
    req.on('end', () => resolve(new URLSearchParams(body)));
    req.on('error', reject);
  });
}

const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
const signingKey = { ...privateKey.export({ format: 'jwk' }), kid: 'test-key-1', use: 'sig', alg: 'RS256' };

const server = http.createServer();
server.listen(0, host, () => {
  const { port } = server.address();
  const issuer = `http://${host}:${port}`;
  const provider = new Provider(issuer, {
    clients,
    jwks: { keys: [signingKey] },
    cookies: { keys: [randomBytes(32).toString('hex')] },
    claims: {
      openid: ['sub'],
      email: ['email', 'email_verified'],
      profile: ['name', 'preferred_username'],
    },
    scopes: ['openid', 'email', 'profile'],
    pkce: { required: () => true },
    features: {
      devInteractions: { enabled: false },
      rpInitiatedLogout: { enabled: true },
    },
    interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
    async findAccount(ctx, sub) {
      const account = accounts[sub];
      if (!account) return undefined;
      return {
        accountId: sub,
        async claims() {
          return {
            sub,
            email: account.email,
            email_verified: Boolean(account.email_verified),
            name: account.name || sub,
            preferred_username: sub,
          };
        },
      };
    },
  });
  const handleProvider = provider.callback();

  async function finishLogin(req, res, details, account) {
    const { Grant } = provider;
    const grant = details.grantId
      ? await Grant.find(details.grantId)
      : new Grant({ accountId: account.accountId, clientId: details.params.client_id });
    // Consent is implied (a test IdP): grant what the client asked for, in the same step.
    grant.addOIDCScope(String(details.params.scope || 'openid'));
    const missing = details.prompt.details || {};
    if (missing.missingOIDCScope) grant.addOIDCScope(missing.missingOIDCScope.join(' '));
    if (missing.missingOIDCClaims) grant.addOIDCClaims(missing.missingOIDCClaims);
    const grantId = await grant.save();
    await provider.interactionFinished(
      req,
      res,
      { login: { accountId: account.accountId }, consent: { grantId } },
      { mergeWithLastSubmission: false },
    );
  }

  async function handleInteraction(req, res) {
    const details = await provider.interactionDetails(req, res);
    if (req.method === 'POST') {
      const form = await readForm(req);
      const account = accountByLogin(form.get('login'));
      if (!account) {
        res.writeHead(400, { 'content-type': 'text/html; charset=utf-8' });
        res.end(loginForm(details.uid, `no account ${form.get('login') || '(empty)'}`));
        return;
      }
      await finishLogin(req, res, details, account);
      return;
    }
    if (details.prompt.name === 'consent' && details.session?.accountId) {
      await finishLogin(req, res, details, { accountId: details.session.accountId });
      return;
    }
    const hinted = accountByLogin(details.params.login_hint);
    if (hinted) {
      await finishLogin(req, res, details, hinted);
      return;
    }
    res.writeHead(200, { 'content-type': 'text/html; charset=utf-8' });
    res.end(loginForm(details.uid, ''));
  }

  server.on('request', (req, res) => {
    if (req.url.startsWith('/interaction/')) {
      handleInteraction(req, res).catch((err) => {
        res.writeHead(400, { 'content-type': 'text/plain; charset=utf-8' });
        res.end(`interaction failed: ${err.message}`);
      });
      return;
    }
    handleProvider(req, res);
  });
  process.stdout.write(`listening ${issuer}\n`);
});

for (const signal of ['SIGINT', 'SIGTERM']) {
  process.on(signal, () => server.close(() => process.exit(0)));
}
