// node jinja_cases.mjs JINJA_PACKAGE_DIR CASES.jsonl: each case's render
// by @huggingface/jinja, one JSON line a case: {"ok": true, "out": BASE64
// of its UTF-8} or {"ok": false, "err": MESSAGE}. The first line of CASES
// holds the variables ({"vars": ...}); each other line a "template".
// Date.now is SOURCE_DATE_EPOCH (strftime_now), as test_jinja.sh sets it.
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const [dir, file] = process.argv.slice(2);
const { Template } = await import(pathToFileURL(`${dir}/dist/index.js`).href);
const fixed = Number(process.env.SOURCE_DATE_EPOCH) * 1000, RealDate = Date;
globalThis.Date = class extends RealDate {
	constructor(...a) {
		super(...(a.length ? a : [fixed]));
	}
};
const [head, ...cases] = readFileSync(file, "utf8").split("\n").filter(Boolean).map((l) => JSON.parse(l));
for (const c of cases) {
	let r;
	try {
		r = { ok: true, out: Buffer.from(new Template(c.template).render(head.vars)).toString("base64") };
	} catch (e) {
		r = { ok: false, err: e.message };
	}
	console.log(JSON.stringify(r));
}
