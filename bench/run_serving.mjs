// Serving figures of bench/SERVING.md from one run: `ellm serve` and llama.cpp's
// llama-server on the same GGUF file, the same machine and the same load, one
// after the other. Servers listen on 127.0.0.1 only; every phase is bounded in
// requests and stops by itself.
//
//   node bench/run_serving.mjs --model /tmp/smollm2-135m-q8_0.gguf
//       [--servers ellm,llama] [--ellm build/ellm]
//       [--llama /tmp/llama.cpp/build/bin/llama-server] [--threads 2]
//       [--levels 1,4,16] [--requests 2] [--prompt-tokens 32] [--max-tokens 64]
//       [--decode-tokens 256]
//       [--long-prompt 512] [--background 8] [--rounds 3] [--no-write: print, write nothing]
//       [--phases throughput,decode,interference]
//
// A server `ellm@BIN` in --servers is ellm serve run from another binary (say
// a copy of an earlier build), so two builds can take turns in one run:
//   --servers ellm@/tmp/ellm-old,ellm --no-write
//
// Phases, per server:
//   throughput    C clients at once (C in --levels), each sending --requests
//                 streamed completions one after another (random token-id
//                 prompts of --prompt-tokens, --max-tokens generated with
//                 ignore_eos, greedy): aggregate generated tokens/s, time to
//                 first token (TTFT) and inter-token latency (ITL) percentiles.
//   decode        C streams at once (C in --levels), one request each of
//                 --decode-tokens generated tokens: aggregate tokens/s over
//                 the window in which every stream is generating (from the
//                 last stream's first token to the first stream's last), so
//                 prompts and the ramp up and down are left out; one stream's
//                 figure is 1 ÷ its mean inter-token gap.
//   interference  TTFT of a --long-prompt-token prompt alone (median of 3),
//                 then again (3 times, one after another) while --background
//                 streams generate; the background streams' ITL median and
//                 p99 over the window in which those prompts arrive.
// Rounds: both phases for every server, the servers taking turns, --rounds
// times; the tables give medians over the rounds.
// Writes bench/results/serving-<UTC time>.json (every sample, the commands, the
// machine from `ellm probe --json`) and regenerates bench/SERVING.md from it
// (`--from FILE.json` re-renders without measuring).
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';

const HERE = path.dirname(new URL(import.meta.url).pathname);
const ROOT = path.dirname(HERE);
const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => {
  if (a.startsWith('--')) acc.push([a.slice(2), all[i + 1] && !all[i + 1].startsWith('--') ? all[i + 1] : '1']);
  return acc;
}, []));
const num = (k, d) => Number(args[k] ?? d);
const cfg = {
  model: args.model,
  servers: (args.servers || 'ellm,llama').split(','),
  ellm: args.ellm || path.join(ROOT, 'build', 'ellm'),
  llama: args.llama || '/tmp/llama.cpp/build/bin/llama-server',
  threads: String(args.threads || '2'),
  levels: (args.levels || '1,4,16').split(',').map(Number),
  requests: num('requests', 2),
  promptTokens: num('prompt-tokens', 32),
  maxTokens: num('max-tokens', 64),
  decodeTokens: num('decode-tokens', 256),
  longPrompt: num('long-prompt', 512),
  background: num('background', 8),
  vocab: num('vocab', 2000),
  rounds: num('rounds', 3),
  phases: (args.phases || 'throughput,decode,interference').split(','),
};
const isEllm = (kind) => kind === 'ellm' || kind.startsWith('ellm@');
const label = (kind) => (kind === 'ellm' ? 'ellm serve' : isEllm(kind) ? `ellm serve (${kind.slice(5)})` : 'llama-server');
const REQUEST_TIMEOUT_MS = 180000;
const log = (...a) => console.error(new Date().toISOString().slice(11, 19), ...a);
const loadavg = () => os.loadavg().map((x) => Math.round(x * 100) / 100);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const pct = (a, p) => {
  if (!a.length) return null;
  const s = [...a].sort((x, y) => x - y);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};
const median = (a) => pct(a, 50);

let seed = 12345;
const rnd = () => (seed = (seed * 1103515245 + 12345) & 0x7fffffff);
const randomPrompt = (n) => Array.from({ length: n }, () => 1 + (rnd() % (cfg.vocab - 1)));

// Slots and context: every slot holds a long prompt plus a long generation.
const slotCtx = Math.max(cfg.longPrompt + 4 * cfg.maxTokens, cfg.promptTokens + cfg.decodeTokens) + 64;
const nSlots = Math.max(...cfg.levels, cfg.background + 1);

function serverCommand(kind) {
  if (isEllm(kind))
    return [kind === 'ellm' ? cfg.ellm : kind.slice(5), ['serve', '-m', cfg.model, '--port', '0', '-t', cfg.threads, '--parallel', String(nSlots),
      '-c', String(slotCtx)]];
  // llama-server splits -c over its slots; -cb: continuous batching
  return [cfg.llama, ['-m', cfg.model, '--host', '127.0.0.1', '--port', String(18000 + (process.pid % 1000)),
    '-t', cfg.threads, '-np', String(nSlots), '-c', String(slotCtx * nSlots), '-cb']];
}

function start(kind) {
  const [bin, argv] = serverCommand(kind);
  log('$', bin, argv.join(' '));
  const proc = spawn(bin, argv, { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => { proc.kill('SIGKILL'); reject(new Error('server did not start:\n' + out.slice(-2000))); }, 120000);
    let up = false;
    const onData = (d) => {
      out = (out + d).slice(-20000); // the server's last words, for a failure report
      const m = !up && out.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) { up = true; clearTimeout(timer); resolve({ proc, base: `http://127.0.0.1:${m[1]}`, cmd: [bin, ...argv], tail: () => out.slice(-3000) }); }
    };
    proc.stdout.on('data', onData);
    proc.stderr.on('data', onData);
    proc.on('exit', (c) => { clearTimeout(timer); if (!up) reject(new Error(`server exited (${c}):\n${out.slice(-2000)}`)); else log(kind, `exited (${c})`); });
  });
}

async function waitHealthy(base) {
  for (let i = 0; i < 1200; i++) {
    try { if ((await fetch(base + '/health')).status === 200) return; } catch { /* starting */ }
    await sleep(100);
  }
  throw new Error('server never became healthy');
}

// One streamed completion. Token arrival times are absolute (performance.now()).
// With `signal`, an abort ends the stream early and returns what arrived;
// onToken(n) is called with the running token count.
// POST of a JSON body on a connection of its own (no keep-alive: llama-server
// closes idle kept-alive connections, which a pooled client finds out only
// when its next request fails); resolves with the response stream.
function postStream(base, pathname, body, signal) {
  return new Promise((resolve, reject) => {
    const u = new URL(pathname, base);
    const req = http.request({ hostname: u.hostname, port: u.port, path: u.pathname, method: 'POST', agent: false, signal,
      headers: { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(body), Connection: 'close' } }, resolve);
    req.on('error', reject);
    req.end(body);
  });
}

async function complete(base, prompt, maxTokens, signal, onToken) {
  const t0 = performance.now();
  // every request ends within REQUEST_TIMEOUT_MS, whatever the server does
  const limit = AbortSignal.timeout(REQUEST_TIMEOUT_MS);
  const res = await postStream(base, '/v1/completions',
    JSON.stringify({ prompt, max_tokens: maxTokens, temperature: 0, ignore_eos: true, stream: true }),
    signal ? AbortSignal.any([signal, limit]) : limit);
  if (res.statusCode !== 200) {
    let text = '';
    for await (const c of res) text += c;
    throw new Error(`HTTP ${res.statusCode}: ${text}`);
  }
  const dec = new TextDecoder();
  let buf = '', usage = null, first = null;
  const times = [];
  try {
    for await (const chunk of res) {
      buf += dec.decode(chunk, { stream: true });
      let i;
      while ((i = buf.indexOf('\n\n')) >= 0) {
        const ev = buf.slice(0, i); buf = buf.slice(i + 2);
        if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
        const j = JSON.parse(ev.slice(6));
        if (j.usage?.completion_tokens) usage = j.usage.completion_tokens;
        const c = j.choices?.[0];
        if (!c) continue;
        // The first chunk with a choice ends the wait for the first token
        // (with max_tokens 1 it may be the final chunk). Token times are the
        // arrivals of the chunks that stand for a token: every chunk but a
        // final one with no text (both servers send one chunk per token, its
        // text possibly empty); tokens ÷ such chunks is reported, so a server
        // that merged tokens into chunks would show it.
        if (first === null) first = performance.now();
        if (typeof c.text !== 'string' || (c.finish_reason && !c.text)) continue;
        times.push(performance.now());
        if (onToken) onToken(times.length);
      }
    }
  } catch (e) {
    if (limit.aborted) throw new Error(`a request took over ${REQUEST_TIMEOUT_MS / 1000} s`);
    if (!(signal && signal.aborted)) throw e;
  }
  return { t0, times, tokens: usage ?? times.length, ttft: first === null ? null : first - t0 };
}
const gapsOf = (times) => times.slice(1).map((t, i) => t - times[i]);

// ellm serve's engine counters (/metrics): steps, rows and seconds by phase.
// null for a server without them.
const PHASES = ['schedule', 'forward', 'sample', 'publish', 'spec'];
async function engineCounters(base) {
  try {
    const text = await (await fetch(base + '/metrics')).text();
    const v = (name) => { const m = text.match(new RegExp('^' + name.replace(/[{}"]/g, (c) => '\\' + c) + ' ([0-9.e+-]+)$', 'm')); return m ? Number(m[1]) : null; };
    const steps = v('ellm_engine_steps_total');
    if (steps === null) return null;
    return { steps, rows: v('ellm_engine_rows_total'),
      phase_s: Object.fromEntries(PHASES.map((p) => [p, v(`ellm_engine_step_seconds_total{phase="${p}"}`)])) };
  } catch { return null; }
}
// Per step between two counter readings: rows and milliseconds by phase.
function stepBreakdown(a, b) {
  if (!a || !b || b.steps <= a.steps) return null;
  const n = b.steps - a.steps;
  return { steps: n, rows_per_step: (b.rows - a.rows) / n,
    ms_per_step: Object.fromEntries(PHASES.map((p) => [p, ((b.phase_s[p] - a.phase_s[p]) / n) * 1000])) };
}

async function throughput(base) {
  const rows = [];
  for (const c of cfg.levels) {
    const la = loadavg();
    const e0 = await engineCounters(base);
    const t0 = performance.now();
    const res = (await Promise.all(Array.from({ length: c }, async () => {
      const out = [];
      for (let r = 0; r < cfg.requests; r++) out.push(await complete(base, randomPrompt(cfg.promptTokens), cfg.maxTokens));
      return out;
    }))).flat();
    const wall = (performance.now() - t0) / 1000;
    const engine = stepBreakdown(e0, await engineCounters(base));
    const tokens = res.reduce((s, r) => s + r.tokens, 0);
    const ttft = res.map((r) => r.ttft).filter((x) => x !== null), gaps = res.flatMap((r) => gapsOf(r.times));
    const chunks = res.reduce((s, r) => s + r.times.length, 0);
    rows.push({ streams: c, requests: res.length, tokens, chunks, tokens_per_chunk: tokens / chunks, wall_s: wall, tok_s: tokens / wall, loadavg_before: la,
      ttft_ms: ttft, ttft_p50_ms: median(ttft), ttft_p99_ms: pct(ttft, 99),
      itl_p50_ms: median(gaps), itl_p99_ms: pct(gaps, 99), itl_samples: gaps.length, engine_steps: engine });
    log(`  ${c} streams: ${(tokens / wall).toFixed(1)} tok/s`);
  }
  return rows;
}

// Aggregate decode throughput: C streams generating at once, counted only
// while all of them are (see the top of the file).
async function decode(base) {
  const rows = [];
  for (const c of cfg.levels) {
    const e0 = await engineCounters(base);
    const res = await Promise.all(Array.from({ length: c }, () => complete(base, randomPrompt(cfg.promptTokens), cfg.decodeTokens)));
    const engine = stepBreakdown(e0, await engineCounters(base));
    const from = Math.max(...res.map((r) => r.times[0])), to = Math.min(...res.map((r) => r.times[r.times.length - 1]));
    let tokens = 0;
    const gaps = [];
    for (const r of res)
      for (let i = 1; i < r.times.length; i++)
        if (r.times[i] > from && r.times[i] <= to) {
          tokens++;
          gaps.push(r.times[i] - r.times[i - 1]);
        }
    const tokS = to > from && tokens > 0 ? (tokens * 1000) / (to - from) : null;
    rows.push({ streams: c, window_ms: to - from, tokens_in_window: tokens, tok_s: tokS,
      itl_p50_ms: median(gaps), itl_p99_ms: pct(gaps, 99), engine_steps: engine });
    log(`  decode, ${c} streams: ${tokS === null ? '—' : tokS.toFixed(1)} tok/s over ${(to - from).toFixed(0)} ms` +
      (engine ? `; engine: ${engine.rows_per_step.toFixed(1)} rows per step, ` +
        PHASES.map((p) => `${p} ${engine.ms_per_step[p].toFixed(2)}`).join(', ') + ' ms per step' : ''));
  }
  return rows;
}

async function interference(base) {
  const alone = [];
  for (let r = 0; r < 3; r++) alone.push((await complete(base, randomPrompt(cfg.longPrompt), 1)).ttft);
  // Background streams generate long enough to outlast the arriving prompts;
  // the window opens once every one of them is producing tokens.
  const ctl = new AbortController();
  const bgTokens = slotCtx - cfg.promptTokens - 8;
  let producing = 0;
  const bg = Array.from({ length: cfg.background }, () =>
    complete(base, randomPrompt(cfg.promptTokens), bgTokens, ctl.signal, (n) => { if (n === 2) producing++; }));
  for (let i = 0; i < 600 && producing < cfg.background; i++) await sleep(100);
  await sleep(2000); // gaps of the streams alone, before any prompt arrives
  const w0 = performance.now();
  const loaded = [];
  for (let r = 0; r < 3; r++) loaded.push((await complete(base, randomPrompt(cfg.longPrompt), 1)).ttft);
  const w1 = performance.now();
  await sleep(200);
  ctl.abort();
  const bgRes = await Promise.all(bg);
  // background gaps that end inside the window of arriving prompts, and
  // those of the 2 s before it (the streams alone: their plain median)
  const gaps = [], before = [];
  let bgTokensSeen = 0;
  for (const r of bgRes) {
    bgTokensSeen += r.times.length;
    for (let i = 1; i < r.times.length; i++) {
      if (r.times[i] >= w0 && r.times[i] <= w1) gaps.push(r.times[i] - r.times[i - 1]);
      else if (r.times[i] >= w0 - 2000 && r.times[i] < w0) before.push(r.times[i] - r.times[i - 1]);
    }
  }
  return { ttft_alone_ms: alone, ttft_loaded_ms: loaded, ttft_ratio: median(loaded) / median(alone),
    background_streams: cfg.background, background_producing_at_window: producing, window_ms: w1 - w0,
    itl_in_window_ms_p50: median(gaps), itl_in_window_ms_p99: pct(gaps, 99), itl_in_window_samples: gaps.length,
    itl_p99_over_p50: pct(gaps, 99) / median(gaps), background_tokens: bgTokensSeen,
    itl_before_ms_p50: median(before), itl_before_ms_p99: pct(before, 99), itl_before_samples: before.length,
    itl_before_p99_over_p50: pct(before, 99) / median(before),
    itl_p99_over_before_p50: pct(gaps, 99) / median(before) };
}

async function measure(kind) {
  const { proc, base, cmd, tail } = await start(kind);
  try {
    await waitHealthy(base);
    await complete(base, randomPrompt(cfg.promptTokens), 8); // warm-up
    const run = async (phase, fn) => {
      if (!cfg.phases.includes(phase)) return null;
      log(kind, phase);
      return fn(base);
    };
    const tp = await run('throughput', throughput);
    const dec = await run('decode', decode);
    const inter = await run('interference', interference);
    return { server: kind, cmd, throughput: tp, decode: dec, interference: inter };
  } catch (e) {
    log(kind, 'failed:', e.message, e.cause ? String(e.cause) : '', '\n--- server log tail ---\n' + tail());
    throw e;
  } finally {
    proc.kill('SIGTERM');
    await sleep(500);
  }
}

// One server's figures over several rounds: the median of each, the
// interference TTFT samples of every round pooled.
function mergeRounds(runs) {
  const med = (xs) => median(xs.filter((x) => x !== null && x !== undefined && !Number.isNaN(x)));
  const pick = (objs, keys) => Object.fromEntries(keys.map((k) => [k, med(objs.map((o) => o[k]))]));
  const tp = runs[0].throughput && runs[0].throughput.map((row, li) => {
    const rs = runs.map((x) => x.throughput[li]);
    const m = pick(rs, ['tok_s', 'ttft_p50_ms', 'ttft_p99_ms', 'itl_p50_ms', 'itl_p99_ms', 'tokens_per_chunk', 'wall_s']);
    const es = rs.map((x) => x.engine_steps).filter(Boolean);
    const engine = es.length ? { steps: med(es.map((e) => e.steps)), rows_per_step: med(es.map((e) => e.rows_per_step)),
      ms_per_step: Object.fromEntries(PHASES.map((p) => [p, med(es.map((e) => e.ms_per_step[p]))])) } : null;
    return { streams: row.streams, ...m, tok_s_rounds: rs.map((x) => x.tok_s), engine_steps: engine };
  });
  const dec = runs[0].decode ? runs[0].decode.map((row, li) => {
    const rs = runs.map((x) => x.decode[li]);
    return { streams: row.streams, ...pick(rs, ['tok_s', 'itl_p50_ms', 'itl_p99_ms', 'window_ms']), tok_s_rounds: rs.map((x) => x.tok_s),
      forward_ms_per_step: med(rs.map((x) => x.engine_steps?.ms_per_step.forward)) };
  }) : null;
  const ins = runs.map((x) => x.interference);
  let inter = null;
  if (ins[0]) {
    const alone = ins.flatMap((i) => i.ttft_alone_ms), loaded = ins.flatMap((i) => i.ttft_loaded_ms);
    inter = { ttft_alone_ms: alone, ttft_loaded_ms: loaded, ttft_ratio: median(loaded) / median(alone),
      ...pick(ins, ['itl_before_ms_p50', 'itl_before_ms_p99', 'itl_before_p99_over_p50', 'itl_in_window_ms_p50', 'itl_in_window_ms_p99', 'itl_p99_over_before_p50', 'itl_p99_over_p50']),
      ttft_ratio_rounds: ins.map((i) => i.ttft_ratio), itl_p99_over_before_p50_rounds: ins.map((i) => i.itl_p99_over_before_p50) };
  }
  return { server: runs[0].server, cmd: runs[0].cmd, throughput: tp, decode: dec, interference: inter };
}

function render(R) {
  const L = [];
  const w = (s = '') => L.push(s);
  const m = R.machine || {};
  w('# Serving');
  w();
  w('`ellm serve` and llama.cpp\'s `llama-server` (native build, `bench/setup-llamacpp-native.sh`) on the same');
  w(`GGUF file, the same machine and the same load, one after the other, from one run of`);
  w('`node bench/run_serving.mjs` (raw results: `' + path.relative(HERE, R.json_path) + '`): ' +
    `${R.config.rounds} rounds, the servers taking turns in each; every figure below is the median over the rounds.`);
  w();
  w(`- Model: \`${path.basename(R.config.model)}\`; ${R.config.threads} threads; ${R.n_slots} slots of ${R.slot_ctx} tokens on both servers.`);
  const bw = (m.numa_nodes || []).map((n) => n.read_gbps).filter(Boolean);
  w(`- Machine: ${m.physical_cores ?? '?'} cores, ${m.isa ?? '?'} kernels, read bandwidth ${bw.length ? bw.join(' + ') + ' GB/s' : 'not probed'} (\`ellm probe\`, start of the run); ` +
    `load average ${R.loadavg_start.join(' / ')} at the start, ${R.loadavg_end.join(' / ')} at the end.`);
  w('- Client: Node on the same machine, each request on a new loopback connection.');
  w(`- Load: random token-id prompts of ${R.config.promptTokens} tokens, ${R.config.maxTokens} tokens generated per request (ignore_eos, greedy), ${R.config.requests} requests per client one after another.`);
  w();
  if (R.servers.some((s) => s.throughput)) {
  w(`## Throughput at ${R.config.levels.join(', ')} concurrent streams`);
  w();
  w('| server | streams | tokens/s | tokens/s of each round | × one stream | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | tokens per chunk |');
  w('|---|---:|---:|---|---:|---:|---:|---:|---:|---:|');
  for (const s of R.servers) {
    if (!s.throughput) continue;
    const one = s.throughput.find((r) => r.streams === Math.min(...R.config.levels));
    for (const r of s.throughput)
      w(`| ${label(s.server)} | ${r.streams} | ${r.tok_s.toFixed(1)} | ` +
        `${(r.tok_s_rounds || [r.tok_s]).map((x) => x.toFixed(0)).join(', ')} | ${(r.tok_s / one.tok_s).toFixed(2)} | ` +
        `${r.ttft_p50_ms.toFixed(1)} | ${r.ttft_p99_ms.toFixed(1)} | ${r.itl_p50_ms.toFixed(1)} | ${r.itl_p99_ms.toFixed(1)} | ` +
        `${r.tokens_per_chunk ? r.tokens_per_chunk.toFixed(2) : '—'} |`);
  }
  const e = R.servers.find((s) => s.server === 'ellm'), l = R.servers.find((s) => s.server === 'llama');
  if (e && l && e.throughput && l.throughput) {
    w();
    const ratios = e.throughput.map((r) => {
      const lr = l.throughput.find((x) => x.streams === r.streams);
      return lr ? `${r.streams} streams ${(r.tok_s / lr.tok_s).toFixed(2)}×` : null;
    }).filter(Boolean);
    w(`ellm serve ÷ llama-server, aggregate tokens/s: ${ratios.join(', ')}.`);
  }
  }
  if (R.servers.some((s) => s.decode)) {
    w();
    w(`## Decode throughput: ${R.config.levels.join(', ')} streams generating at once`);
    w();
    w(`Each stream one request (a ${R.config.promptTokens}-token prompt, ${R.config.decodeTokens} tokens generated); tokens/s counts the token chunks that arrive while every`);
    w('stream is generating (from the last stream\'s first token to the first stream\'s last), so the prompts and the');
    w('ramp up and down are left out; for one stream it is 1 ÷ its mean inter-token gap.');
    w();
    w('| server | streams | tokens/s | tokens/s of each round | × one stream | ITL p50 ms | ITL p99 ms | forward ms per step |');
    w('|---|---:|---:|---|---:|---:|---:|---:|');
    const f = (x, d = 1) => (x === null || x === undefined || Number.isNaN(x) ? '—' : x.toFixed(d));
    for (const s of R.servers) {
      if (!s.decode) continue;
      const one = s.decode.find((r) => r.streams === Math.min(...R.config.levels));
      for (const r of s.decode)
        w(`| ${label(s.server)} | ${r.streams} | ${f(r.tok_s)} | ` +
          `${(r.tok_s_rounds || [r.tok_s]).map((x) => f(x, 0)).join(', ')} | ${one && one.tok_s ? f(r.tok_s / one.tok_s, 2) : '—'} | ` +
          `${f(r.itl_p50_ms)} | ${f(r.itl_p99_ms)} | ${f(r.forward_ms_per_step, 2)} |`);
    }
  }
  if (R.servers.some((s) => s.interference)) {
  w();
  w(`## A ${R.config.longPrompt}-token prompt arriving while ${R.config.background} streams generate`);
  w();
  w('TTFT of the long prompt alone and while the streams run (3 of each per round, the median of all), and the running streams\' inter-token');
  w('latency over the window in which those prompts arrive. TTFT is the time to the first streamed chunk; ITL is');
  w('the gap between consecutive token chunks. Both servers send one chunk per generated token (its text may');
  w('be empty: a random-weight model often picks tokens with no text), so ITL is per token; the throughput');
  w('table\'s last column (tokens from `usage` ÷ token chunks) shows it. Tokens/s counts tokens from each');
  w('response\'s `usage`.');
  w();
  w('The last two columns compare the window\'s p99 with the streams\' median over the 2 s before the first');
  w('prompt arrives (the streams alone), and with the window\'s own median. The streams\' own p99 ÷ p50 over');
  w('those 2 s, with no prompt arriving, is the spread the machine gives a steady load.');
  w();
  w('| server | TTFT alone ms | TTFT loaded ms | loaded ÷ alone | streams\' ITL p50 / p99 before ms | streams alone p99 ÷ p50 | ITL p50 in window ms | ITL p99 in window ms | p99 ÷ p50 before | p99 ÷ p50 in window |');
  w('|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|');
  for (const s of R.servers) {
    const i = s.interference;
    if (!i) continue;
    const f = (x, d = 1) => (x === null || x === undefined || Number.isNaN(x) ? '—' : x.toFixed(d));
    w(`| ${label(s.server)} | ${f(median(i.ttft_alone_ms))} | ${f(median(i.ttft_loaded_ms))} | ` +
      `${f(i.ttft_ratio, 2)} | ${f(i.itl_before_ms_p50)} / ${f(i.itl_before_ms_p99)} | ${f(i.itl_before_p99_over_p50, 2)} | ${f(i.itl_in_window_ms_p50)} | ${f(i.itl_in_window_ms_p99)} | ` +
      `${f(i.itl_p99_over_before_p50, 2)} | ${f(i.itl_p99_over_p50, 2)} |`);
  }
  }
  const es = R.servers.find((x) => x.server === 'ellm');
  if (es && es.throughput && es.throughput.some((r) => r.engine_steps)) {
    w();
    w('## Where an engine step\'s time goes (ellm serve)');
    w();
    w('From the server\'s own counters (`/metrics` `ellm_engine_step_seconds_total{phase}`, read before and after');
    w('each load level of the throughput table): milliseconds per step. `forward` is the batched forward pass;');
    w('`schedule` (cancellations, admission, KV pages, choosing rows), `sample` (sampling, detokenizing, stop');
    w('strings) and `publish` (lock, metrics, handing tokens to the streams) are the engine thread\'s work around');
    w('it. HTTP threads format and send the chunks on their own threads, outside these phases.');
    w();
    w('| streams | steps | rows per step | schedule ms | forward ms | sample ms | publish ms | outside forward |');
    w('|---:|---:|---:|---:|---:|---:|---:|---:|');
    for (const r of es.throughput) {
      const e = r.engine_steps;
      if (!e) continue;
      const m = e.ms_per_step, out = m.schedule + m.sample + m.publish + m.spec;
      w(`| ${r.streams} | ${e.steps} | ${e.rows_per_step.toFixed(1)} | ${m.schedule.toFixed(3)} | ${m.forward.toFixed(2)} | ` +
        `${m.sample.toFixed(3)} | ${m.publish.toFixed(3)} | ${((100 * out) / (out + m.forward)).toFixed(1)}% |`);
    }
  }
  w();
  w('## Reproduce');
  w();
  w('```sh');
  w('make && sh bench/setup-llamacpp-native.sh');
  w('build/ellm synth --shape smollm2-135m --type q8_0 -o /tmp/smollm2-135m-q8_0.gguf');
  w('node bench/run_serving.mjs --model /tmp/smollm2-135m-q8_0.gguf');
  w('```');
  w();
  return L.join('\n');
}

// Everything from this line on in bench/SERVING.md (dated notes on runs of
// other tools, such as bench_batch) is kept when the tables are regenerated.
const KEEP = '<!-- Sections below are kept when run_serving.mjs regenerates this file. -->';
function writeServing(text) {
  const file = path.join(HERE, 'SERVING.md');
  let kept = '';
  try {
    const old = fs.readFileSync(file, 'utf8');
    const at = old.indexOf(KEEP);
    if (at >= 0) kept = old.slice(at);
  } catch (e) { /* no file yet */ }
  fs.writeFileSync(file, kept ? text.replace(/\n*$/, '\n\n') + kept : text);
}

async function main() {
  if (args.from) {
    const R = JSON.parse(fs.readFileSync(args.from, 'utf8'));
    R.json_path = path.resolve(args.from);
    writeServing(render(R));
    return;
  }
  if (!cfg.model) { console.error('--model FILE is required'); process.exit(2); }
  let machine = null;
  try { machine = JSON.parse(execFileSync(cfg.ellm, ['probe', '--json'], { encoding: 'utf8' })); } catch (e) { log('probe failed:', e.message); }
  const R = { config: cfg, n_slots: nSlots, slot_ctx: slotCtx, machine, loadavg_start: loadavg(), rounds: [] };
  // the servers take turns, round after round, so a change in the machine's
  // background load falls on both; the tables give each figure's median
  for (let r = 0; r < cfg.rounds; r++) {
    log(`round ${r + 1} of ${cfg.rounds}`);
    const round = [];
    for (const kind of cfg.servers) round.push(await measure(kind));
    R.rounds.push(round);
  }
  R.servers = cfg.servers.map((kind) => mergeRounds(R.rounds.map((round) => round.find((x) => x.server === kind))));
  R.loadavg_end = loadavg();
  const stamp = new Date().toISOString().replace(/[-:]/g, '').slice(0, 13).replace('T', '-');
  R.json_path = path.join(HERE, 'results', `serving-${stamp}.json`);
  if (args['no-write']) { console.log(render(R)); return; } // a trial: nothing written
  fs.mkdirSync(path.join(HERE, 'results'), { recursive: true });
  fs.writeFileSync(R.json_path, JSON.stringify(R, null, 1));
  log('raw results:', R.json_path);
  writeServing(render(R));
  log('wrote bench/SERVING.md');
}

main().catch((e) => { console.error(e.stack || e.message); process.exit(1); });
