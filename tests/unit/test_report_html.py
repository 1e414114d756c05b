"""The HTML report (galvatron_fx.report.html): what it draws is what the plan and the run say, the
page is self-contained, and it renders in a real headless browser.

The browser check runs where Chromium is installed; ``.ci/run`` installs it and sets
``GFX_REQUIRE_BROWSER=1``, which makes its absence a failure rather than a skip.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import zlib

import pytest

import galvatron_fx as gfx
from galvatron_fx import cli
from galvatron_fx.errors import ConfigError


@pytest.fixture(scope="module")
def graph():
    from galvatron_fx import zoo

    model, ex = zoo.build("gpt-tiny", batch_size=8, seq_len=64, device="meta")
    return gfx.capture(model, ex)


@pytest.fixture(scope="module")
def pipelined(graph):
    """gpt-tiny on two 8-GPU nodes, two pipeline stages of 4 micro-batches."""
    cluster = gfx.Cluster.from_spec("dgx-a100-80g", 2)
    return gfx.plan(graph, cluster, global_batch_size=16, baselines=False,
                    search={"pp": (2,), "num_microbatches": (4,)})


@pytest.fixture(scope="module")
def flat(graph):
    """gpt-tiny on two 8-GPU nodes, no pipeline: data-parallel groups cross the nodes."""
    cluster = gfx.Cluster.from_spec("dgx-a100-80g", 2)
    return gfx.plan(graph, cluster, global_batch_size=16, baselines=False, search={"pp": (1,)})


def _section(page: str, sid: str) -> str:
    start = page.index(f'<section id="{sid}">')
    return page[start:page.index("</section>", start)]


def test_the_page_draws_every_layer_op_and_stage(pipelined, tmp_path):
    plan = pipelined
    out = plan.report(tmp_path / "r.html")
    page = out.read_text()
    for sid in ("summary", "strategy", "memory", "timeline", "comm", "measured"):
        assert f'<section id="{sid}">' in page, sid
    assert page.count('class="layer"') == len(plan.layers)
    # a forward and a backward per micro-batch per chunk, as the schedule runs them
    assert _section(page, "timeline").count('class="op"') == 2 * plan.pp * plan.virtual_stages * plan.num_microbatches
    mem = _section(page, "memory")
    assert mem.count("stage ") >= plan.pp and 'id="budget"' in mem
    # each stage's bar adds up to what the device shows (or the tensor peak): its label
    from galvatron_fx.report.fmt import fmt_bytes

    shown = plan.predicted.reserved_peak_bytes or plan.predicted.peak_memory_bytes
    for b in shown:
        assert f">{fmt_bytes(b)}<" in mem, (fmt_bytes(b), mem[-800:])
    # self-contained: nothing fetched
    assert not re.search(r'(src|href)\s*=\s*"(https?:)?//', page) and "<link" not in page
    assert "No training run given" in _section(page, "measured")


def test_groups_that_cross_nodes_are_marked(flat, pipelined):
    from galvatron_fx.report import html as report_html

    rows = re.findall(r"<tr><td>(tp|dp)</td><td>([^<]*)</td><td>([^<]*)</td><td[^>]*>([a-z-]+)</td>",
                      _section(report_html.render(flat), "comm"))
    assert rows, "no process group rows"
    # the search records the axis of every collective it prices
    assert all(c.get("axis") in ("tp", "dp") for lp in flat.layers for c in lp.collectives)
    per_node = flat.cluster["devices_per_node"]
    for axis, groups, _nodes, link in rows:
        crosses = any(len({int(r) // per_node for r in g.split(",")}) > 1 for g in groups.split(" | "))
        assert link == ("inter-node" if crosses else "intra-node"), (axis, groups, link)
    # 16 devices, no pipeline: some group spans both nodes; pipelined, each stage is one node
    assert any(link == "inter-node" for *_, link in rows)
    # explain(layer) says the same of each layer's groups
    tiers = set()
    for lp in flat.layers:
        line = next(l for l in flat.explain(lp.name).splitlines() if l.startswith("groups: "))
        ranks, tp = list(flat.stage_ranks[lp.stage]), lp.strategy.tp
        for axis, size, groups in (("tp", tp, [ranks[i:i + tp] for i in range(0, len(ranks), tp)]),
                                   ("dp", lp.dp, [ranks[t::tp] for t in range(tp)])):
            part = next((p for p in line.removeprefix("groups: ").split("; ") if p.startswith(axis + " ")), None)
            assert (part is not None) == (size > 1), line
            if part is not None:
                crosses = any(len({r // per_node for r in g}) > 1 for g in groups)
                assert part.startswith(f"{axis} ranks {','.join(map(str, groups[0]))}"), part
                assert part.endswith("inter-node" if crosses else "intra-node"), part
                tiers.add(part.rsplit(" ", 1)[1])
    assert "inter-node" in tiers, tiers
    piped = re.findall(r"<td[^>]*>(inter-node|intra-node)</td><td class=\"num\">",
                       _section(report_html.render(pipelined), "comm"))
    assert piped and set(piped) == {"intra-node"}


def test_a_run_directory_gives_predicted_against_measured(pipelined, tmp_path):
    from galvatron_fx.report import html as report_html

    run = tmp_path / "run"
    run.mkdir()
    pred = pipelined.predicted.step_time_s
    (run / "report.json").write_text(json.dumps({"predicted": {"step_time_s": pred},
                                                 "measured": {"step_time_s": 1.5 * pred}}))
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": i + 1, "loss": 5.0 - 0.1 * i, "step_s": pred * (1 + i)})
                                               + "\n" for i in range(6)))
    page = report_html.render(pipelined, run)
    measured = _section(page, "measured")
    assert "1.50×" in measured  # measured / predicted, read from report.json
    assert measured.count("<circle") == 12  # six steps in each of the step-time and loss charts
    assert 'id="step_chart"' in measured and 'id="loss_chart"' in measured
    # metrics alone: the measured step is their median after warm-up
    (run / "report.json").unlink()
    page = report_html.render(pipelined, run)
    assert "5.00×" in _section(page, "measured")  # steps 4..6: 4, 5, 6 × pred -> median 5
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\nnot json\n')
    with pytest.raises(ConfigError, match=r"metrics.jsonl:2 is malformed JSON"):
        report_html.render(pipelined, run)
    with pytest.raises(ConfigError, match="does not exist"):
        report_html.render(pipelined, tmp_path / "nowhere")


def test_cli_report(pipelined, tmp_path, capsys):
    plan_path = pipelined.save(tmp_path / "plan.json")
    assert cli.main(["report", str(plan_path), "--out", str(tmp_path / "r.html")]) == 0
    assert "wrote" in capsys.readouterr().out and (tmp_path / "r.html").stat().st_size > 1000
    assert cli.main(["report", str(tmp_path / "missing.json"), "--out", str(tmp_path / "x.html")]) == 2
    assert not (tmp_path / "x.html").exists()


# ---- a real browser ---------------------------------------------------------------------


def _browser() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def _png_pixels(data: bytes):
    """The RGB(A) pixels of a PNG (8-bit, non-interlaced, as Chromium writes) as a numpy array."""
    import numpy as np

    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, ihdr = 8, b"", None
    while pos < len(data):
        (n,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    w, h, depth, color, _, _, interlace = ihdr
    assert depth == 8 and interlace == 0 and color in (2, 6), ihdr
    bpp = 3 if color == 2 else 4
    raw = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(h, 1 + w * bpp)
    out = np.zeros((h, w * bpp), dtype=np.int32)
    prev = np.zeros(w * bpp, dtype=np.int32)
    for y in range(h):
        f, line = raw[y, 0], raw[y, 1:].astype(np.int32)
        if f == 0:
            cur = line
        elif f == 2:
            cur = (line + prev) & 255
        else:  # sub, average, paeth: each byte depends on the one bpp to its left
            cur = line.copy()
            for x in range(w * bpp):
                a = cur[x - bpp] if x >= bpp else 0
                if f == 1:
                    pred = a
                elif f == 3:
                    pred = (a + prev[x]) >> 1
                else:
                    b, c = prev[x], (prev[x - bpp] if x >= bpp else 0)
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                cur[x] = (cur[x] + pred) & 255
        out[y] = cur
        prev = cur
    return out.reshape(h, w, bpp)[:, :, :3]


@pytest.mark.timing
def test_the_page_renders_in_headless_chromium(pipelined, tmp_path):
    browser = _browser()
    if browser is None:
        if os.environ.get("GFX_REQUIRE_BROWSER") == "1":
            pytest.fail("GFX_REQUIRE_BROWSER=1 but no chromium is installed (apt-get install chromium)")
        pytest.skip("no chromium here (apt-get install chromium); .ci/run installs it")
    page = pipelined.report(tmp_path / "r.html")
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0"]
    url = page.resolve().as_uri()
    dom = subprocess.run(flags + ["--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    # the page's script ran to its end (it marks the body) and logged nothing to the console
    assert re.search(r'<body data-ready="1"', dom.stdout), dom.stdout[:500]
    assert "CONSOLE" not in dom.stderr and "Uncaught" not in dom.stderr, dom.stderr[-2000:]
    for sid in ("strategy", "memory", "timeline", "comm"):
        assert f'id="{sid}"' in dom.stdout
    shot = tmp_path / "r.png"
    run = subprocess.run(flags + ["--window-size=640,480", f"--screenshot={shot}", url],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and shot.exists(), run.stderr[-2000:]
    px = _png_pixels(shot.read_bytes())
    assert px.shape[:2] == (480, 640)
    ink = (px.min(axis=2) < 200).mean()  # share of pixels that are not white or near it
    colours = len({tuple(p) for p in px[::4, ::4].reshape(-1, 3).tolist()})
    assert ink > 0.03 and colours > 20, (ink, colours)


def test_a_local_cluster_of_two_nodes_shows_its_crossing_groups(graph, tmp_path):
    from galvatron_fx.report import html as report_html

    cluster = gfx.Cluster.local_cpu(nodes=2, devices_per_node=2)
    assert (cluster.num_nodes, cluster.devices_per_node, cluster.world_size) == (2, 2, 4)
    assert cluster.node_of(1) == 0 and cluster.node_of(2) == 1
    with pytest.raises(ConfigError, match="do not split into 3 nodes"):
        gfx.Cluster.local_cpu(4, nodes=3)
    # where the figures come from: an empty cache holds no profile (the session's may: the demo test)
    bare = gfx.Cluster.local_cpu(nodes=2, devices_per_node=2, cache_dir=tmp_path)
    assert bare.describe_source().startswith("no hardware profile for this machine")
    assert "datasheet figures" in gfx.Cluster.preset("dgx-a100-80g").describe_source()
    assert not cluster.is_heterogeneous
    plan = gfx.plan(graph, cluster, global_batch_size=8, baselines=False, search={"pp": (1,)})
    assert all(lp.strategy.tp <= 2 for lp in plan.layers)  # tensor parallelism stays within a node
    links = re.findall(r"<tr><td>(tp|dp)</td><td>[^<]*</td><td>([^<]*)</td><td[^>]*>([a-z-]+)</td>",
                       _section(report_html.render(plan), "comm"))
    assert ("dp", "0,1", "inter-node") in links, links


def test_the_predicted_step_as_a_chrome_trace(pipelined, tmp_path):
    """One row per stage, a forward and a backward per micro-batch and chunk, in the order the
    schedule runs them, in microseconds; what the HTML timeline draws."""
    path = pipelined.chrome_trace(tmp_path / "trace.json")
    trace = json.loads(path.read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    m, v = pipelined.num_microbatches, pipelined.virtual_stages
    assert len(spans) == 2 * m * pipelined.pp * v
    assert {e["tid"] for e in spans} == set(range(pipelined.pp))
    names = [e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"]
    assert names[0].startswith("stage 0 (ranks ")
    for tid in range(pipelined.pp):  # a stage runs one thing at a time
        row = sorted((e["ts"], e["ts"] + e["dur"]) for e in spans if e["tid"] == tid)
        assert all(a[1] <= b[0] + 1e-3 for a, b in zip(row, row[1:]))
    end = max(e["ts"] + e["dur"] for e in spans)
    assert 0 < end <= pipelined.predicted.step_time_s * 1e6 * (1 + 1e-9)
