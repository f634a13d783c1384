// node jinja_ref.mjs JINJA_PACKAGE_DIR TEMPLATE VARS.json: what
// @huggingface/jinja renders (stdout), or "error: MESSAGE" on stderr and
// exit 1. strftime_now() reads SOURCE_DATE_EPOCH when it is set, as
// strata's does.
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const [dir, tpath, vpath] = process.argv.slice(2);
const { Template } = await import(pathToFileURL(`${dir}/dist/index.js`).href);
if (process.env.SOURCE_DATE_EPOCH) {
	const fixed = Number(process.env.SOURCE_DATE_EPOCH) * 1000;
	const RealDate = Date;
	globalThis.Date = class extends RealDate {
		constructor(...a) {
			super(...(a.length ? a : [fixed]));
		}
	};
}
try {
	const template = new Template(readFileSync(tpath, "utf8"));
	const vars = vpath === "-" ? {} : JSON.parse(readFileSync(vpath, "utf8"));
	process.stdout.write(template.render(vars));
} catch (e) {
	process.stderr.write(`error: ${e.message}\n`);
	process.exit(1);
}
