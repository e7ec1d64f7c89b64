#!/usr/bin/env python3
"""Checks of a `trainer report` page as headless Chromium rendered it (tests/report.sh).

  page_check.py inject PAGE.html COPY.html   a copy of the page with a script that measures,
      once laid out, every SVG <text> box, its SVG's box, each series' stroke, every table
      cell and legend entry, and writes them into the DOM (<pre id="measured">) for --dump-dom
  page_check.py check DOM.html REPORT.json   the page against --json and its own layout:
    - every section is there; every plotted series equals --json's points;
    - every number cell's data-value equals --json's value at its data-key, and its text is
      that value in the human units its key calls for (formatted here, independently of the C);
      a rank cell --json holds as null says so in words;
    - (measured pages) no text in a figure, number cell or legend has a raw exponent or more
      than 6 significant digits; no two text boxes of a figure overlap; none falls outside its
      SVG; every legend entry is words (no JSON key); where a prediction is plotted with its
      measurement, the measurement is drawn last and the prediction dashed and wider, so both
      show where they coincide."""
import html
import json
import math
import re
import struct
import sys
from html.parser import HTMLParser

MEASURE = r"""<script>
(function () {
  const box = (e) => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  const out = {svgs: [], cells: [], legends: [], width: document.documentElement.clientWidth};
  document.querySelectorAll("svg").forEach((svg) => {
    const sec = svg.closest("section"), fig = svg.closest("figure");
    out.svgs.push({
      where: (sec ? sec.id : "?") + (fig ? ": " + fig.querySelector("figcaption").textContent : ""),
      box: box(svg),
      texts: [...svg.querySelectorAll("text")].map((t) => ({text: t.textContent, box: box(t)})),
      series: [...svg.querySelectorAll("g[data-series]")].map((g) => {
        const p = g.querySelector("polyline");
        return {key: g.dataset.series, dash: p ? p.getAttribute("stroke-dasharray") : null,
                width: p ? parseFloat(p.getAttribute("stroke-width")) : null};
      }),
    });
  });
  document.querySelectorAll("td").forEach((td) =>
    out.cells.push({text: td.textContent, number: td.classList.contains("n"), box: box(td)}));
  document.querySelectorAll(".legend span").forEach((s) => out.legends.push(s.textContent));
  const pre = document.createElement("pre");
  pre.id = "measured";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>"""

# ---- the page's human units, written here from their definitions (trainer/trainer.h) ---------
SI = ["p", "n", "\u00b5", "m", "", "k", "M", "G", "T", "P", "E"]
BIN = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]


def power(x, binary):
    a, base, p = abs(x), 1024 if binary else 1000, 0
    if not math.isfinite(a) or a == 0:
        return 0
    while p < 6 and a >= base:
        a, p = a / base, p + 1
    while not binary and p > -4 and a < 1:
        a, p = a * base, p - 1
    return p


def scaled(x, p, binary, dec, unit):
    if not math.isfinite(x):
        return "-"
    p = max(0 if binary else -4, min(6, p))
    v = x / math.pow(1024 if binary else 1000, p)
    v = 0.0 if v == 0 else v
    return "%.*f%s%s%s" % (max(dec, 0), v, " " if unit else "", BIN[p] if binary else SI[p + 4], unit)


def si(x, unit):
    if not math.isfinite(x):
        return "-"
    p = power(x, False)
    v = abs(x) / math.pow(1000, p)
    if v >= 999.5 and p < 6:
        p += 1
        v = abs(x) / math.pow(1000, p)
    return scaled(x, p, False, 0 if v == 0 or v >= 99.95 else 1 if v >= 9.995 else 2, unit)


def hms(s):
    if not math.isfinite(s) or abs(s) >= 3.6e12:
        return si(s, "s")
    t = math.floor(abs(s) + 0.5)
    return "%s%d:%02d:%02d" % ("-" if s < 0 and t else "", t // 3600, t // 60 % 60, t % 60)


def seconds(s):
    return hms(s) if math.isfinite(s) and abs(s) >= 59.5 else si(s, "s")


def percent(share):
    p = 100 * share
    if not math.isfinite(p):
        return "-"
    if p != 0 and abs(p) < 0.005:
        return (">-" if p < 0 else "<") + "0.01%"
    return "%.*f%%" % (0 if abs(p) >= 99.95 else 1 if abs(p) >= 9.995 else 2, 0.0 if p == 0 else p)


def num(x):
    a = abs(x)
    if not math.isfinite(x) or a >= 1e6 or (a < 1e-6 and a != 0):
        return si(x, "")
    d = 0 if x == math.floor(x) else 3 - math.floor(math.log10(a))
    s = "%.*f" % (max(d, 0), 0.0 if x == 0 else x)
    return s.rstrip("0").rstrip(".") if "." in s else s


def nbytes(x):
    if not math.isfinite(x):
        return "-"
    G = 1024.0 ** 3
    if x >= 1024 * G:
        return scaled(x, power(x, True), True, 2, "B")
    if x >= G:
        return "%.2f GiB" % (x / G)
    if x >= 1024.0 ** 2:
        return "%.1f MiB" % (x / 1024.0 ** 2)
    if x >= 1024.0:
        return "%.1f KiB" % (x / 1024.0)
    return "%.0f B" % x


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def real(v):
    """The shortest text that reads back as v; for a float printed with %.9g, as that float."""
    from_float = abs(v) <= 3.4028234663852886e38 and float("%.9g" % f32(v)) == v
    for p in range(1, 18):
        t = "%.*g" % (p, v)
        if (f32(float(t)) == f32(v)) if from_float else float(t) == v:
            break
    if "e" in t and 1e-6 <= abs(v) < 1e17:
        t = "%.*f" % (max(p - 1 - math.floor(math.log10(abs(v))), 0), v)
    return t


WHOLE = {"attempt", "step", "rank", "steps", "ranks", "attempts", "after_attempt", "steps_redone",
         "start_step", "last_step", "failed_rank"}


def expected_text(key, v):
    """The text a number cell shows, chosen from its JSON path alone."""
    path = key.split(".")
    last = path[-1]
    parent = path[-2] if len(path) > 1 else ""
    if last in WHOLE:
        return str(int(v))
    if last == "tokens_per_s":
        return si(v, "tok/s")
    if last == "mfu":
        return percent(v)
    if last == "flops":
        return si(v, "FLOP")
    if last == "booked_hours":
        return seconds(v * 3600)
    if last.endswith("memory_bytes") or parent in ("memory_bytes", "predicted_bytes"):
        return nbytes(v)
    if last.endswith("_s") or "_s_per_" in last:
        return seconds(v)
    return num(v)  # tokens, losses, costs, slowdowns


# ---- the page --------------------------------------------------------------------------------
class Page(HTMLParser):
    def __init__(s):
        super().__init__()
        s.sections, s.series, s.cells, s.cur, s.pre, s.measured = [], {}, [], None, False, ""
        s.prov, s.pcur = [], None

    def handle_starttag(s, tag, a):
        a = dict(a)
        if tag == "section":
            s.sections.append(a.get("id"))
        if "data-series" in a:
            s.series[a["data-series"]] = (a["data-x"].split(), a["data-y"].split())
        if tag == "td" and "data-key" in a:
            s.cur = [a["data-key"], a.get("data-value"), ""]
        if tag == "td" and "data-prov" in a:
            s.pcur = [a["data-prov"], ""]
        if tag == "pre" and a.get("id") == "measured":
            s.pre = True

    def handle_data(s, d):
        if s.cur:
            s.cur[2] += d
        if s.pcur:
            s.pcur[1] += d
        if s.pre:
            s.measured += d

    def handle_endtag(s, tag):
        if tag == "td" and s.cur:
            s.cells.append(s.cur)
            s.cur = None
        if tag == "td" and s.pcur:
            s.prov.append(s.pcur)
            s.pcur = None
        if tag == "pre":
            s.pre = False


def against_json(p, js, bad):
    want = ["summary", "loss", "throughput", "breakdown", "heatmap", "memory", "timeline", "plan",
            "provenance", "contribution"]
    if [x for x in want if x not in p.sections]:
        bad.append(f"sections missing: {set(want) - set(p.sections)}")

    def get(path):
        v = js
        for k in path.split("."):
            v = v[int(k)] if isinstance(v, list) else v[k]
        return v

    S = js["series"]
    for name, (xk, yk) in {"loss": ("step", "loss"), "val_loss": ("step", "val_loss"),
                           "loss_time": ("time_s", "loss"), "tokens_per_s": ("time_s", "tokens_per_s"),
                           "mfu": ("time_s", "mfu"), "step_s": ("step", "step_s"),
                           "predicted_step_s": ("step", "predicted_step_s"),
                           "memory_bytes": ("step", "memory_bytes")}.items():
        pts = [(x, y) for x, y in zip(S[xk], S[yk]) if x is not None and y is not None]
        if name not in p.series:
            if pts:
                bad.append(f"series {name} not plotted")
            continue
        got = list(zip(map(float, p.series[name][0]), map(float, p.series[name][1])))
        if not got:
            bad.append(f"series {name} has no points")
        if got != pts:
            bad.append(f"series {name}: page {got[:3]}... json {pts[:3]}...")
    n = 0
    for key, val, text in p.cells:
        text = text.strip()
        try:
            j = get(key)
        except (KeyError, IndexError, TypeError):
            bad.append(f"cell {key}: not in --json")
            continue
        n += 1
        if val is None:  # a text cell
            if str(j) != text and not (j == "" and text == "-"):
                bad.append(f"{key}: page '{text}' json '{j}'")
        elif val == "null":
            if j is not None:
                bad.append(f"{key}: page null, json {j}")
            if key.endswith("rank") and not re.fullmatch(r"[a-z][a-z :,]*", text):
                bad.append(f"{key}: a rank that is not there shown as '{text}', not in words")
        elif isinstance(j, (int, float)) and not isinstance(j, bool):
            if key.endswith("failed_rank") and get(key[:-len("failed_rank")] + "status") == "ended":
                bad.append(f"{key}: a finished attempt shown with failed rank '{text}' (json {j}), not words")
            if key == "summary.tokens" and j != math.floor(j):
                bad.append(f"summary.tokens: {j} is not a count")
            if float(val) != float(j):
                bad.append(f"{key}: data-value {val}, json {j}")
            elif text != expected_text(key, j):
                bad.append(f"{key}: shows '{text}', expected '{expected_text(key, j)}' (json {j})")
    # a number of provenance.json (read here from the run folder): its real digits (0.1 for a
    # float written as 0.100000001), the exact value in data-value
    def leaves(v, key=""):
        if isinstance(v, dict):
            for k, x in v.items():
                yield from leaves(x, f"{key}.{k}" if key else k)
        elif isinstance(v, list):
            for i, x in enumerate(v):
                yield from leaves(x, f"{key}[{i}]")
        else:
            yield key, v
    try:
        numbers = {k: v for k, v in leaves(json.load(open(js["run_dir"] + "/provenance.json")))
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
    except OSError:
        numbers = {}
    for key, text in p.prov:
        if key in numbers and text.strip() != real(float(numbers[key])):
            bad.append(f"provenance {key}: shows '{text.strip()}', its digits are '{real(float(numbers[key]))}'")
    return f"{len(p.sections)} sections, {len(p.series)} series, {n} cells equal to --json's"


def overlap(a, b, tol=0.5):
    return min(a[2], b[2]) - max(a[0], b[0]) > tol and min(a[3], b[3]) - max(a[1], b[1]) > tol


def unreadable(text):
    """A raw exponent, or a number of more than 6 significant digits."""
    if re.search(r"\d[eE][+-]?\d", text):
        return "a raw exponent"
    for m in re.findall(r"\d[\d,]*(?:\.\d+)?", text):
        digits = m.replace(",", "").replace(".", "").lstrip("0")
        if len(digits.rstrip("0") if "." not in m else digits) > 6:
            return f"{m}: more than 6 significant digits"
    return None


def layout(p, bad):
    m = json.loads(html.unescape(p.measured))
    n_text = 0
    for svg in m["svgs"]:
        B, T = svg["box"], svg["texts"]
        n_text += len(T)
        for i, t in enumerate(T):
            why = unreadable(t["text"])
            if why:
                bad.append(f"{svg['where']}: '{t['text']}': {why}")
            b = t["box"]
            if b[0] < B[0] - 0.5 or b[1] < B[1] - 0.5 or b[2] > B[2] + 0.5 or b[3] > B[3] + 0.5:
                bad.append(f"{svg['where']}: '{t['text']}' at {[round(x) for x in b]} outside its "
                           f"figure {[round(x) for x in B]}")
            for u in T[i + 1:]:
                if overlap(b, u["box"]):
                    bad.append(f"{svg['where']}: '{t['text']}' and '{u['text']}' overlap")
        keys = [s["key"] for s in svg["series"]]
        for s in svg["series"]:
            if s["key"].startswith("predicted_") and s["key"][10:] in keys:
                meas = svg["series"][keys.index(s["key"][10:])]
                if keys.index(s["key"]) > keys.index(meas["key"]) or not s["dash"] or \
                        not (s["width"] or 0) > (meas["width"] or 0):
                    bad.append(f"{svg['where']}: {s['key']} drawn over {meas['key']} or alike "
                               f"(order {keys}, dash {s['dash']}, widths {s['width']}/{meas['width']})")
    for c in m["cells"]:
        why = c["number"] and unreadable(c["text"])
        if why:
            bad.append(f"cell '{c['text']}': {why}")
        if c["box"][2] > m["width"] + 0.5:
            bad.append(f"cell '{c['text']}' past the page's right edge")
    for entry in m["legends"]:
        if "_" in entry or not re.fullmatch(r"[A-Za-z][A-Za-z /()-]*", entry.strip()):
            bad.append(f"legend entry '{entry}' is not words")
    return (f"{len(m['svgs'])} figures, {n_text} texts clear of each other and inside, "
            f"{len(m['cells'])} cells, {len(m['legends'])} legend entries in words")


def main():
    if sys.argv[1] == "inject":
        page = open(sys.argv[2]).read()
        open(sys.argv[3], "w").write(page.replace("</body>", MEASURE + "</body>"))
        return 0
    p = Page()
    p.feed(open(sys.argv[2]).read())
    bad = []
    said = [against_json(p, json.load(open(sys.argv[3])), bad)]
    if p.measured:
        said.append(layout(p, bad))
    elif len(sys.argv) > 4 and sys.argv[4] == "--layout":
        bad.append("the page was not measured (no <pre id=measured>: did the script run?)")
    print("\n".join(bad[:30]) + (f"\n... {len(bad) - 30} more" if len(bad) > 30 else "") if bad
          else "; ".join(said))
    return 1 if bad else 0


sys.exit(main())
