"""Refresh the JavaScript the offline slide decks use, from the npm registry, with the npm client.

The files under ``vendor/slides/`` are committed, so exporting a deck needs no network and a
deck needs none at view time. This script is how they got here and how to move them to new
versions: it runs ``npm pack`` for each package pinned in ``package.json`` (beside this file),
copies only the files listed in :data:`FILES` (and each package's licence), and writes
``MANIFEST.json`` with every file's package, source path and SHA-256, which
``tests/test_slides.py`` checks against the committed files.

    python3 vendor/slides/update.py       # needs npm; about 20 MB downloaded, 8 MB kept
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: npm package -> [(path in its tarball, path under vendor/slides)]; nothing else is kept.
FILES = {
    "reveal.js": [
        ("package/dist/reveal.js", "reveal.js/dist/reveal.js"),
        ("package/dist/reveal.css", "reveal.js/dist/reveal.css"),
        ("package/plugin/notes/notes.js", "reveal.js/plugin/notes/notes.js"),
        ("package/LICENSE", "LICENSES/reveal.js.txt"),
    ],
    "requirejs": [
        ("package/require.js", "requirejs/require.js"),  # ships no LICENSE file: its header says MIT
    ],
    "jquery": [
        ("package/dist/jquery.min.js", "jquery/dist/jquery.min.js"),
        ("package/LICENSE.txt", "LICENSES/jquery.txt"),
    ],
    "@jupyter-widgets/html-manager": [
        ("package/dist/embed-amd.js", "@jupyter-widgets/html-manager/dist/embed-amd.js"),
        ("package/dist/embed.js.LICENSE.txt", "LICENSES/jupyter-widgets-html-manager-bundled.txt"),
        # Font Awesome, referenced by the bundle's CSS next to itself; browsers fetch only woff2.
        ("package/dist/1551f4f60c37af51121f.woff2", "@jupyter-widgets/html-manager/dist/1551f4f60c37af51121f.woff2"),
        ("package/dist/7a3337626410ca2f4071.woff2", "@jupyter-widgets/html-manager/dist/7a3337626410ca2f4071.woff2"),
        ("package/dist/d878b0a6a1144760244f.woff2", "@jupyter-widgets/html-manager/dist/d878b0a6a1144760244f.woff2"),
    ],
    "mathjax": [
        # The "full" TeX component bundles every TeX extension, so nothing is fetched on demand.
        ("package/es5/tex-svg-full.js", "mathjax/es5/tex-svg-full.js"),
        ("package/LICENSE", "LICENSES/mathjax.txt"),
    ],
}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> int:
    pins = json.loads((HERE / "package.json").read_text())["dependencies"]
    if set(pins) != set(FILES):
        raise SystemExit(f"package.json pins {sorted(pins)} but FILES lists {sorted(FILES)}: make them agree.")
    manifest = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, version in pins.items():
            out = subprocess.run(["npm", "pack", "--silent", f"{name}@{version}"], cwd=tmp, check=True,
                                 capture_output=True, text=True).stdout.split()[-1]
            with tarfile.open(Path(tmp) / out) as tar:
                for source, target in FILES[name]:
                    member = tar.extractfile(source)
                    if member is None:
                        raise SystemExit(f"{name}@{version} has no file {source}")
                    dest = HERE / target
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    dest.write_bytes(member.read())
                    manifest[target] = {"package": f"{name}@{version}", "source": source, "sha256": sha256(dest)}
    theme = "reveal.js/dist/theme/workbench.css"
    manifest[theme] = {"package": "fsdp-workbench", "source": theme, "sha256": sha256(HERE / theme)}
    (HERE / "MANIFEST.json").write_text(json.dumps(dict(sorted(manifest.items())), indent=1) + "\n")
    total = sum((HERE / p).stat().st_size for p in manifest)
    print(f"{len(manifest)} files, {total / 2**20:.1f} MiB, in {HERE}")
    return 0


if __name__ == "__main__":
    if shutil.which("npm") is None:
        raise SystemExit("npm not found: install Node.js (Debian: apt-get install npm) to refresh the vendored files.")
    sys.exit(main())
