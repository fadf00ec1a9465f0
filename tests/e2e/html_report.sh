# End-to-end: the one-page report results/<name>.html (issue 14, part 5), checked in a real
# headless browser (Debian's chromium; setup.sh installs it).
#
# A tiny-model sweep (2 learning rates) writes results/tiny.html beside the .md/.tex/.csv. The page
# must be self-contained (no script, no external resource: plots inlined as data: URIs) and, as
# chromium parses it (--dump-dom): its metric table's numbers equal the CSV's, line for line, at
# full precision (data-* attributes) and as shown (the visible text); every inlined plot equals
# the PNG file byte for byte (all plots; of the confusion matrices, the best trial's, the note
# says which); the provenance shows the trial files' model and data hashes; the
# experiment file's text is there verbatim. chromium's screenshot of the page (1280x2000) must
# show the table's text and the plot's colored lines (pixel counts, decoded here).
source "$(dirname "$0")/lib.bash"
SRC=$(pwd)
cd "$TMP"
tiny_fixture "$SRC" 1
sed -i 's/seeds = {1, 2},/seeds = {1},/' tiny.lua
expect_run "a sweep writes the page" 0 "written: .*results/tiny\.html" -- "$GM" tiny.lua
expect_run "self-contained: no script, no link, no external source" 0 "^self-contained$" -- \
  bash -c "grep -Eiq '<script|<link|src=\"(https?:|file:|/)' results/tiny.html && echo external || echo self-contained"

CHROME=""
for c in chromium chromium-browser google-chrome; do command -v "$c" >/dev/null && { CHROME=$c; break; }; done
find_python "h5py, numpy"
if [ -z "$CHROME" ] || [ -z "$PY" ]; then
  skip_unless_ci "the page in a headless browser (no chromium or no Python with h5py: run ./setup.sh)"
  finish
fi
chrome() { "$CHROME" --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --hide-scrollbars "$@" 2>/dev/null; }
chrome --dump-dom "file://$PWD/results/tiny.html" > dom.html
chrome --window-size=1280,2000 --screenshot="$PWD/shot.png" "file://$PWD/results/tiny.html" > /dev/null

cat > check.py <<'PY'
import base64, csv, glob, h5py, html, re, struct, sys, zlib
from html.parser import HTMLParser

class Page(HTMLParser):
    """Collects the metric table's data cells (attributes and text), images, provenance rows, <pre>,
    note paragraphs."""
    def __init__(self):
        super().__init__()
        self.cells, self.imgs, self.prov, self.pre, self.notes = [], [], {}, [], []
        self.where, self.td, self.text, self.row = [], None, "", []
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table": self.where.append(a.get("class", ""))
        if tag in ("td", "th", "pre") or (tag == "p" and a.get("class") == "note"): self.td, self.text = (tag, a), ""
        if tag == "img": self.imgs.append(a["src"])
        if tag == "tr": self.row = []
    def handle_endtag(self, tag):
        if tag == "table": self.where.pop()
        if tag in ("td", "th", "pre", "p") and self.td:
            kind, a = self.td
            t = self.text.strip()
            if tag == "p": self.notes.append(t)
            elif tag == "pre": self.pre.append(self.text)
            elif self.where and self.where[-1] == "metric" and tag == "td": self.cells.append((a, t))
            elif self.where and self.where[-1] == "provenance": self.row.append(t)
            self.td = None
        if tag == "tr" and self.where and self.where[-1] == "provenance" and len(self.row) == 2:
            self.prov[self.row[0]] = self.row[1]
    def handle_data(self, d):
        if self.td: self.text += d

page = Page()
page.feed(open("dom.html", encoding="utf-8").read())
lines = [r for r in csv.DictReader(open("results/tiny.csv")) if r["kind"] in ("baseline", "fine-tuned")]
assert len(page.cells) == len(lines) > 0, (len(page.cells), len(lines))
keys = [("mean", "data-mean"), ("std", "data-std"), ("n", "data-n"), ("ci_low", "data-ci-low"),
        ("ci_high", "data-ci-high"), ("p_vs_baseline", "data-p-baseline"), ("p_vs_best", "data-p-best")]
for (a, text), r in zip(page.cells, lines):
    for ck, hk in keys:
        assert a.get(hk, "") == r[ck], (ck, a.get(hk), r[ck])
    assert text.startswith("%.1f" % float(r["mean"])), (text, r["mean"])
    if r["ci_low"]:
        assert "[%.1f, %.1f]" % (float(r["ci_low"]), float(r["ci_high"])) in text, (text, r)
    assert (r["best"] == "1") == ("best" in a.get("class", "")), (a, r)
print("table: %d cells equal the CSV" % len(page.cells))
# every plot, and of the confusion matrices (one per trial and phase) the best trial's two
pngs = [p for p in glob.glob("results/tiny_*.png") if "_confusion_" not in p]
best = re.search(r"those of trial (\d+), the best", "".join(page.notes))
assert best, page.notes
pngs = sorted(pngs + glob.glob("results/tiny_confusion_%s_*.png" % best.group(1)))
inlined = sorted(base64.b64decode(s.split(",", 1)[1]) for s in page.imgs)
assert len(pngs) > 2 and inlined == sorted(open(p, "rb").read() for p in pngs), (len(inlined), pngs)
assert len(glob.glob("results/tiny_confusion_*.png")) == 4, "2 trials x (baseline, final)"
print("plots: %d inlined, byte for byte" % len(inlined))
with h5py.File(sorted(glob.glob("results/tiny/trial-*.h5"))[0], "r") as f:
    for k in ("model_sha256", "data_sha256", "git_commit"):
        want = f["provenance"].attrs[k]
        assert want in page.prov.get(k, ""), (k, want, page.prov.get(k))
print("provenance: model_sha256, data_sha256, git_commit as in the trial files")
assert page.pre and page.pre[0] == open("tiny.lua", encoding="utf-8").read(), "experiment text"
print("experiment file: verbatim")

def png_rgb(path):
    """(width, height, rows of (r, g, b) bytes) of an 8-bit, non-interlaced RGB or RGBA PNG."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR": w, h, depth, ctype, _, _, inter = struct.unpack(">IIBBBBB", body)
        if kind == b"IDAT": idat += body
        pos += 12 + n
    assert depth == 8 and ctype in (2, 6) and inter == 0, (depth, ctype, inter)
    bpp = 3 if ctype == 2 else 4
    raw, stride, prev, rows, i = zlib.decompress(idat), w * bpp, bytearray(w * bpp), [], 0
    for _ in range(h):
        f, line = raw[i], bytearray(raw[i + 1:i + 1 + stride]); i += 1 + stride
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b, c = prev[x], prev[x - bpp] if x >= bpp else 0
            if f == 1: line[x] = (line[x] + a) & 255
            elif f == 2: line[x] = (line[x] + b) & 255
            elif f == 3: line[x] = (line[x] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c; pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(line); prev = line
    return w, h, rows, bpp

w, h, rows, bpp = png_rgb("shot.png")
assert (w, h) == (1280, 2000), (w, h)
dark = colored = 0
for line in rows[::2]:
    for x in range(0, w * bpp, bpp * 2):
        r, g, b = line[x], line[x + 1], line[x + 2]
        if max(r, g, b) < 100: dark += 1
        if max(r, g, b) - min(r, g, b) > 100: colored += 1
assert dark > 500 and colored > 200, (dark, colored)
print("screenshot: 1280x2000, %d dark (text) and %d colored (plot) sampled pixels" % (dark, colored))
PY
expect_run "chromium's DOM: the table equals the CSV, plots, provenance, experiment text" 0 \
  "table: [0-9]+ cells equal the CSV.*plots: [0-9]+ inlined, byte for byte.*provenance: .*experiment file: verbatim.*screenshot: 1280x2000, [0-9]+ dark \(text\) and [0-9]+ colored \(plot\)" -- "$PY" check.py
finish
