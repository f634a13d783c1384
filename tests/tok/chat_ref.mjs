// node chat_ref.mjs --jinja DIR --tokenizers LIB --tokenizer DIR
//                   [--template FILE] --data JSONL --text TEXT [--shard BIN]
// The reference strata tokenize --format chat is held to (test_chat_ref.sh):
//   1. each conversation of JSONL rendered by @huggingface/jinja (DIR, its
//      package folder) with the contract's variables (messages, bos_token
//      and eos_token from tokenizer_config.json when it has them,
//      add_generation_prompt false) equals, byte for byte, the line strata
//      wrote to TEXT (--text-out);
//   2. with --shard, the shard's tokens, loss mask and document starts
//      equal what this script derives on its own: the assistant spans from
//      prefix renders (docs/tokenizer.md), the whole text encoded by
//      @lenml/tokenizers (LIB: its dist/main.js), each token's bytes from
//      tokenizer.json's vocabulary (byte-level BPE), the mask 1 on the
//      tokens that overlap a span, from the first through the first
//      special one.
// strftime_now() reads SOURCE_DATE_EPOCH when set. Prints what differs and
// exits 1; 0 when all agree.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";
import path from "node:path";

const args = {};
for (let a = process.argv.slice(2); a.length; ) args[a.shift().replace(/^--/, "")] = a.shift();
const { Template } = await import(pathToFileURL(`${args.jinja}/dist/index.js`).href);
if (process.env.SOURCE_DATE_EPOCH) {
	const fixed = Number(process.env.SOURCE_DATE_EPOCH) * 1000, RealDate = Date;
	globalThis.Date = class extends RealDate {
		constructor(...a) {
			super(...(a.length ? a : [fixed]));
		}
	};
}
const json = (p, optional) => {
	try {
		return JSON.parse(readFileSync(p, "utf8"));
	} catch (e) {
		if (optional && e.code === "ENOENT") return {};
		throw e;
	}
};
const cfg = json(path.join(args.tokenizer, "tokenizer_config.json"), true);
const template = new Template(args.template ? readFileSync(args.template, "utf8") : cfg.chat_template);
const special = (x) => (typeof x === "string" ? x : x && typeof x.content === "string" ? x.content : undefined);
const bos = special(cfg.bos_token), eos = special(cfg.eos_token);
const render = (messages, add_generation_prompt) =>
	template.render({
		messages,
		...(bos !== undefined ? { bos_token: bos } : {}),
		...(eos !== undefined ? { eos_token: eos } : {}),
		add_generation_prompt,
	});
const convs = readFileSync(args.data, "utf8").split("\n").filter((l) => l.trim()).map((l) => JSON.parse(l).messages);
const texts = readFileSync(args.text, "utf8").split("\n").filter((l) => l).map((l) => JSON.parse(l));
let bad = 0;
const fail = (msg) => {
	console.log(`FAIL ${msg}`);
	bad++;
};
const firstDiff = (a, b) => {
	let i = 0;
	while (i < a.length && i < b.length && a[i] === b[i]) i++;
	return i;
};
if (texts.length !== convs.length) fail(`${texts.length} texts for ${convs.length} conversations`);
const full = convs.map((m) => render(m, false));
full.forEach((t, i) => {
	if (texts[i] !== t) {
		const d = firstDiff(texts[i] ?? "", t);
		fail(`conversation ${i + 1}: strata ${JSON.stringify((texts[i] ?? "").slice(d, d + 40))} ` +
			`@huggingface/jinja ${JSON.stringify(t.slice(d, d + 40))} at ${d}`);
	}
});

if (args.shard && !bad) {
	const require = createRequire(import.meta.url);
	const { TokenizerLoader } = require(args.tokenizers);
	const tj = json(path.join(args.tokenizer, "tokenizer.json"));
	const tok = TokenizerLoader.fromPreTrained({ tokenizerJSON: tj, tokenizerConfig: cfg });
	const specials = new Set(tj.added_tokens.filter((a) => a.special).map((a) => a.id));
	for (const name of cfg.additional_special_tokens ?? [])
		for (const a of tj.added_tokens) if (a.content === special(name)) specials.add(a.id);
	// a span bound inside an added token's text takes the whole token in
	const added = tj.added_tokens.map((a) => a.content).filter((a) => a.length > 1);
	const snap = (t, b, end) => {
		for (const a of added)
			for (let p = Math.max(0, b - a.length + 1); p < b; p++)
				if (p + a.length > b && t.startsWith(a, p)) return end ? p + a.length : p;
		return b;
	};
	// each token's bytes: an added token's content, or a vocabulary entry
	// through GPT-2's byte-to-character table (the byte-level BPE of the
	// tokenizers tested here)
	const byteOf = new Map();
	{
		const bs = [];
		for (let c = 33; c <= 126; c++) bs.push(c);
		for (let c = 161; c <= 172; c++) bs.push(c);
		for (let c = 174; c <= 255; c++) bs.push(c);
		let extra = 0;
		for (let c = 0; c < 256; c++) byteOf.set(String.fromCodePoint(bs.includes(c) ? c : 256 + extra++), c);
	}
	const vocabText = new Map(Object.entries(tj.model.vocab).map(([k, v]) => [v, k]));
	for (const a of tj.added_tokens) vocabText.set(a.id, null);
	const addedText = new Map(tj.added_tokens.map((a) => [a.id, a.content]));
	const bytesOf = (id) =>
		addedText.has(id) ? Buffer.from(addedText.get(id)) : Buffer.from([...vocabText.get(id)].map((ch) => byteOf.get(ch)));
	const u8 = (t, i) => Buffer.byteLength(t.slice(0, i));
	const ids = [], mask = [], docs = [];
	convs.forEach((msgs, c) => {
		const t = full[c], spans = [];
		let last = 0;
		msgs.forEach((m, k) => {
			if (m.role !== "assistant") return;
			const s = Math.max(snap(t, firstDiff(render(msgs.slice(0, k), true), t), false), last);
			const e = snap(t, firstDiff(render(msgs.slice(0, k + 1), false), t), true);
			if (s < e) spans.push([u8(t, s), u8(t, e)]), (last = e);
		});
		docs.push(ids.length);
		const toks = Array.from(tok.encode(t, { add_special_tokens: false }));
		const off = [];
		let at = 0;
		for (const id of toks) off.push(at), (at += bytesOf(id).length);
		off.push(at);
		if (Buffer.concat(toks.map(bytesOf)).compare(Buffer.from(t)) !== 0) {
			// a normalizer changed the text (Qwen's NFC): the text in pieces
			// at the spans' bounds, the mask through the first special token
			const tb = Buffer.from(t), enc = (x) => (x.length ? Array.from(tok.encode(x, { add_special_tokens: false })) : []);
			let at = 0;
			for (const [s, e] of [...spans, [tb.length, tb.length]]) {
				for (const id of enc(tb.subarray(at, s).toString())) ids.push(id), mask.push(0);
				let on = 1;
				for (const id of enc(tb.subarray(s, e).toString())) {
					ids.push(id), mask.push(on);
					if (specials.has(id)) on = 0;
				}
				at = e;
			}
			return;
		}
		const m = toks.map(() => 0);
		for (const [s, e] of spans) {
			const first = toks.findIndex((_, i) => off[i + 1] > s && off[i] < e);
			for (let i = first; first >= 0 && i < toks.length && off[i] < e; i++) {
				m[i] = 1;
				if (specials.has(toks[i])) break;
			}
		}
		ids.push(...toks);
		mask.push(...m);
	});
	const b = readFileSync(args.shard), h = (i) => b.readInt32LE(4 * i);
	const n = h(2), w = h(0) === 20240801 ? 4 : 2, flags = h(4), nd = h(7);
	const got = [], gotMask = [], gotDocs = [];
	for (let i = 0; i < n; i++) got.push(w === 4 ? b.readUInt32LE(1024 + 4 * i) : b.readUInt16LE(1024 + 2 * i));
	for (let i = 0; i < n; i++) gotMask.push(b[1024 + w * n + i]);
	const docsAt = Math.ceil((1024 + w * n + n) / 8) * 8;
	for (let i = 0; i < nd; i++) gotDocs.push(Number(b.readBigUInt64LE(docsAt + 8 * i)));
	if (h(3) !== 0x41525453 || flags !== 3) fail(`header: int32 3 ${h(3)}, flags ${flags}`);
	if (b.length !== docsAt + 8 * nd) fail(`shard of ${b.length} bytes, not ${docsAt + 8 * nd}`);
	const cmp = (what, x, y) => {
		const d = firstDiff(x, y);
		if (d < x.length || d < y.length)
			fail(`${what}: strata ${JSON.stringify(x.slice(d, d + 8))} reference ` +
				`${JSON.stringify(y.slice(d, d + 8))} at ${d} of ${x.length}/${y.length}`);
	};
	cmp("tokens", got, ids);
	cmp("mask", gotMask, mask);
	cmp("documents", gotDocs, docs);
	if (!bad) console.log(`ok: ${convs.length} conversations, ${n} tokens, ${mask.filter((x) => x).length} in the mask`);
}
if (!bad && !args.shard) console.log(`ok: ${convs.length} conversations rendered alike`);
process.exit(bad ? 1 : 0);
