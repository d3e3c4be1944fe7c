// build.mjs bundles the console into internal/controlplane/console/dist (embedded in the
// panda binary): src/main.js and src/style.css with everything they import,
// minified, under names that carry a hash of their content, and an
// index.html that loads them. Run by `make build` (see the Makefile).
import * as esbuild from 'esbuild';
import fs from 'node:fs';
import path from 'node:path';

const here = path.dirname(new URL(import.meta.url).pathname);
const out = path.resolve(here, '../../internal/controlplane/console/dist');

fs.mkdirSync(out, { recursive: true });
for (const f of fs.readdirSync(out)) {
  if (f !== 'README.md') fs.rmSync(path.join(out, f), { recursive: true });
}

const result = await esbuild.build({
  entryPoints: [path.join(here, 'src/main.js'), path.join(here, 'src/style.css')],
  bundle: true,
  minify: true,
  format: 'esm',
  target: ['chrome110', 'firefox110', 'safari16'],
  entryNames: '[name]-[hash]',
  assetNames: '[name]-[hash]',
  outdir: out,
  metafile: true,
  legalComments: 'linked',
  logLevel: 'warning',
});

const names = {};
for (const [file, meta] of Object.entries(result.metafile.outputs)) {
  if (meta.entryPoint) names[path.basename(meta.entryPoint)] = path.basename(file);
}
// Relative URLs: the page is served at / (or under a public path prefix).
const html = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="color-scheme" content="light">
<title>PandaStack console</title>
<link rel="stylesheet" href="console/${names['style.css']}">
<script type="module" src="console/${names['main.js']}"></script>
</head>
<body>
<div id="app"><noscript>The PandaStack console needs JavaScript.</noscript></div>
</body>
</html>
`;
fs.writeFileSync(path.join(out, 'index.html'), html);
console.log(`console: built ${Object.values(names).join(', ')} into ${path.relative(process.cwd(), out)}`);
