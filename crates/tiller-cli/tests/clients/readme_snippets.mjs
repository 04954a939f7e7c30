// The README's JavaScript snippets (under "From any client"), as written there
// but for the server's address, each run with the npm packages it imports.
//
// usage: node readme_snippets.mjs NODE_MODULES BASE_URL README
// prints what each snippet printed, one list of lines per snippet (JSON)
import { readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { pathToFileURL } from "node:url";

const [modules, base, readme] = process.argv.slice(2);
const section = readFileSync(readme, "utf8").split("### From any client")[1].split("\n### ")[0];
const snippets = section.split("```js\n").slice(1).map((block) => block.split("```")[0]);
const log = console.log;
const printed = [];
for (const [index, snippet] of snippets.entries()) {
  const lines = [];
  console.log = (...args) => lines.push(args.join(" "));
  // Beside node_modules, so that the snippet's imports resolve as in a project.
  const file = join(dirname(modules), `readme-snippet-${index}.mjs`);
  writeFileSync(file, snippet.replaceAll("http://127.0.0.1:8787", base));
  try {
    await import(pathToFileURL(file).href);
  } finally {
    console.log = log;
  }
  printed.push(lines);
}
console.log(JSON.stringify(printed));
