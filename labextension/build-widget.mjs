// Builds the notebook widget from the sidebar's sources: jupyter_mesh/ui/static/widget.js is
// labextension/src/grid.ts compiled by tsc (tsconfig.widget.json), and widget.css is
// labextension/style/states.css + grid.css. `npm run build:lib` runs this after `tsc`.
//
// Both outputs are committed: the Python package loads them (anywidget's _esm and _css), and a
// checkout or an install that never ran npm must still show the widget. `--check` writes nothing and
// fails when a committed file differs from what the sources give (tests/test_frontend_sources.py
// runs it); the fix is `npm run build:lib`.

import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = dirname(dirname(fileURLToPath(import.meta.url)));
const check = process.argv.includes('--check');
const read = rel => readFileSync(join(root, rel), 'utf8');

function compile() {
  const out = mkdtempSync(join(tmpdir(), 'jm-widget-'));
  try {
    const tsc = createRequire(import.meta.url).resolve('typescript/bin/tsc');
    execFileSync(process.execPath, [tsc, '-p', join(root, 'tsconfig.widget.json'), '--outDir', out], {
      stdio: 'inherit'
    });
    return readFileSync(join(out, 'grid.js'), 'utf8');
  } finally {
    rmSync(out, { recursive: true, force: true });
  }
}

const js = compile();
// anywidget loads one file from a blob URL: nothing in it may import (grid.ts imports types only)
const imports = js.split('\n').filter(l => /^\s*import[\s{*('"]|^\s*export\s.*\sfrom\s|\brequire\(/.test(l));
if (imports.length) {
  console.error(`labextension/src/grid.ts compiles to a module that imports:\n  ${imports.join('\n  ')}\n` +
    'anywidget needs one self-contained file: import types only (import type ...) in grid.ts');
  process.exit(1);
}
const header = (open, close) =>
  `${open}GENERATED from labextension/ by \`npm run build:lib\` (labextension/build-widget.mjs): do not edit.${close}\n`;
const outputs = {
  'jupyter_mesh/ui/static/widget.js': header('// ', '') + js,
  'jupyter_mesh/ui/static/widget.css':
    header('/* ', ' */') + read('labextension/style/states.css') + read('labextension/style/grid.css')
};

let stale = 0;
for (const [rel, text] of Object.entries(outputs)) {
  let current = null;
  try {
    current = read(rel);
  } catch {
    // not there yet
  }
  if (current === text) {
    continue;
  }
  if (check) {
    console.error(`${rel} differs from what labextension/ gives: run \`npm run build:lib\` and commit it`);
    stale += 1;
  } else {
    writeFileSync(join(root, rel), text);
    console.log(`${rel}: written`);
  }
}
process.exit(stale ? 1 : 0);
