// Soak test for `ellm serve` (not part of `make test`): N clients on
// 127.0.0.1 for a bounded time, each sending streamed and plain requests and
// walking away mid-stream at random. At the end every request must have
// succeeded or been cancelled by its own client, and the server must be back
// to idle: no running or waiting requests, no KV blocks beyond the slots'
// kept prefixes, resident memory near where it started.
//
// Idle values are read twice: after loading, and after a warm-up (one plain
// request per client, then idle): the warm-up faults in what every server
// holds once it has served (the KV pool's warm reserve, each slot's first
// pages, thread stacks), so "back to idle" compares the end with the
// warm-up. RSS is sampled every 30 s during the run.
//
//   node bench/serve_soak.mjs [--model models/evalmodel.gguf] [--clients 16]
//       [--seconds 600] [--threads 2] [--bin build/ellm] [--rss-slack-kb 16384]
import { spawn } from 'node:child_process';
import fs from 'node:fs';

const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => {
  if (a.startsWith('--')) acc.push([a.slice(2), all[i + 1] && !all[i + 1].startsWith('--') ? all[i + 1] : '1']);
  return acc;
}, []));
const model = args.model || 'models/evalmodel.gguf';
const clients = Number(args.clients || 16);
const seconds = Number(args.seconds || 600);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const rss = (pid) => {
  const m = fs.readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+) kB/);
  return m ? Number(m[1]) : NaN;
};

async function metrics(base) {
  const t = await (await fetch(base + '/metrics')).text();
  const get = (n) => Number((t.match(new RegExp('^' + n.replace(/[{}"=]/g, (c) => '\\' + c) + ' (\\S+)$', 'm')) || [])[1]);
  return { running: get('ellm_requests_running'), waiting: get('ellm_requests_waiting'), kv: get('ellm_kv_blocks_used'),
    ok: get('ellm_requests_total{status="ok"}'), cancelled: get('ellm_requests_total{status="cancelled"}'),
    errors: get('ellm_requests_total{status="error"}'), overloaded: get('ellm_requests_total{status="overloaded"}') };
}

async function main() {
  const proc = spawn(args.bin || 'build/ellm', ['serve', '-m', model, '--port', '0', '-t', args.threads || '2',
    '--parallel', String(clients), '-c', '512'], { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  const base = await new Promise((resolve, reject) => {
    proc.stderr.on('data', (d) => {
      log += d;
      const m = log.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) resolve(`http://127.0.0.1:${m[1]}`);
    });
    proc.on('exit', (c) => reject(new Error(`server exited ${c}: ${log}`)));
  });
  while ((await fetch(base + '/health').catch(() => ({ status: 0 }))).status !== 200) await sleep(100);
  const rss0 = rss(proc.pid);
  const kv0 = (await metrics(base)).kv;
  // warm-up: one plain request per client at once, then idle
  await Promise.all(Array.from({ length: clients }, (_, c) => fetch(base + '/v1/completions', {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: `def warm${c}(x):\n`, max_tokens: 32, temperature: 0 }) }).then((r) => r.text())));
  await sleep(1500);
  const rssWarm = rss(proc.pid), kvWarm = (await metrics(base)).kv;
  console.log(`idle after loading: RSS ${rss0} kB, kv blocks ${kv0}; idle after warm-up: RSS ${rssWarm} kB, kv blocks ${kvWarm}`);
  const t0 = Date.now(), samples = [];
  const sampler = setInterval(() => {
    const r = rss(proc.pid);
    samples.push(r);
    console.log(`  ${Math.round((Date.now() - t0) / 1000)} s: RSS ${r} kB`);
  }, 30000);
  const end = Date.now() + seconds * 1000;
  let sent = 0, failed = 0, aborted = 0;
  await Promise.all(Array.from({ length: clients }, async (_, c) => {
    while (Date.now() < end) {
      const ac = new AbortController();
      const stream = Math.random() < 0.7, leave = stream && Math.random() < 0.3;
      sent++;
      try {
        const res = await fetch(base + '/v1/completions', {
          method: 'POST', signal: ac.signal, headers: { 'Content-Type': 'application/json' },
          body: JSON.stringify({ prompt: `def f${c}_${sent}(x):\n`, max_tokens: 8 + Math.floor(Math.random() * 120),
            temperature: Math.random(), stream }),
        });
        if (res.status !== 200) { failed++; console.error('HTTP', res.status, await res.text()); continue; }
        if (!stream) { await res.json(); continue; }
        let n = 0;
        for await (const _chunk of res.body) {
          if (leave && ++n === 3) { aborted++; ac.abort(); break; }
        }
      } catch (e) {
        if (!ac.signal.aborted) { failed++; console.error(e.message); }
      }
    }
  }));
  clearInterval(sampler);
  await sleep(1500);
  const m = await metrics(base);
  const rss1 = rss(proc.pid);
  const slack = Number(args['rss-slack-kb'] || 16384);
  console.log(`requests ${sent}, failed ${failed}, walked away ${aborted}; server: ok ${m.ok}, cancelled ${m.cancelled}, ` +
    `errors ${m.errors}, overloaded ${m.overloaded}; after: running ${m.running}, waiting ${m.waiting}, ` +
    `kv blocks ${m.kv} (at most ${clients * 32} kept for prefixes); RSS ${rss0} kB loaded, ${rssWarm} kB after ` +
    `warm-up, ${samples.length ? Math.max(...samples) : NaN} kB highest sample, ${rss1} kB at the end ` +
    `(allowed: warm-up + ${slack} kB)`);
  proc.kill('SIGTERM');
  const ok = failed === 0 && m.errors === 0 && m.running === 0 && m.waiting === 0 && m.kv <= clients * 32 &&
    rss1 <= rssWarm + slack;
  console.log(ok ? 'soak: PASS' : 'soak: FAIL');
  process.exit(ok ? 0 : 1);
}
main().catch((e) => { console.error(e); process.exit(1); });
