"""`snapshot --output html`: the page is opened in a real headless Chromium and what it draws is checked.

The DOM Chromium builds (`--dump-dom`) says which element stands for what; a screenshot, read with
a small PNG decoder below, says it is drawn in the failed colour where a person would see it.
"""

from __future__ import annotations

import asyncio
import os
import struct
import sys
import zlib
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

from testkit.hostile_text import INVISIBLE, OVERDRAWN, hidden_in
from testkit.tools import tool
from watcher.kubelet.client import PodResourcesClient
from watcher.model.build import build
from watcher.model.wording import printable
from watcher.sim.fake_kubelet import FakeKubelet
from watcher.sim.fake_node import default_node
from watcher.snapshot.html import MAX_LABEL, STATE_COLOURS, render_html
from watcher.snapshot.take import Snapshot, take_snapshot

ROOT = Path(__file__).resolve().parent.parent
GPU = "nvidia.com/gpu"
# Chromium starts in about a second here; a hung one must not hold the suite.
CHROMIUM_TIMEOUT = 30.0


def _chromium() -> str:
    return tool("chromium")


async def _run(*cmd: str, timeout: float = CHROMIUM_TIMEOUT, env: dict[str, str] | None = None) -> bytes:
    """`cmd`'s stdout; fails on a non-zero exit, kills it past `timeout`."""
    proc = await asyncio.create_subprocess_exec(
        *cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode == 0, (cmd[:3], err.decode(errors="replace")[-2000:])
    return out


def _browser_args(profile: Path) -> list[str]:
    # A profile of its own per run (no state shared with any other browser), sRGB so the colours in
    # the screenshot are the page's own, no scrollbars painted over the page.
    return [
        _chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--force-color-profile=srgb",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
    ]


async def _dump_dom(page: Path, profile: Path) -> str:
    out = await _run(*_browser_args(profile), "--dump-dom", page.as_uri())
    return out.decode()


async def _screenshot(page: Path, profile: Path, png: Path, size: tuple[int, int]) -> bytes:
    shot = [f"--screenshot={png}", f"--window-size={size[0]},{size[1]}"]
    await _run(*_browser_args(profile), *shot, page.as_uri())
    return png.read_bytes()


# --- the DOM as a tree ---

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    children: list[Element] = field(default_factory=list)
    text: list[str] = field(default_factory=list)

    def walk(self) -> list[Element]:
        out = [self]
        for c in self.children:
            out += c.walk()
        return out

    def all_text(self) -> str:
        return "".join(self.text) + "".join(c.all_text() for c in self.children)


class _Tree(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Element("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        el = Element(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(el)
        if tag not in VOID:
            self.stack.append(el)

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i].tag == tag:
                del self.stack[i:]
                return

    def handle_data(self, data: str) -> None:
        self.stack[-1].text.append(data)


def _tree(markup: str) -> Element:
    parser = _Tree()
    parser.feed(markup)
    parser.close()
    return parser.root


# --- a PNG decoder: enough for Chromium's 8-bit RGB(A) screenshots ---


def _pixels(png: bytes) -> tuple[int, int, list[tuple[int, int, int]]]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks, header = 8, [], b""
    while pos < len(png):
        (length,) = struct.unpack(">I", png[pos : pos + 4])
        kind, body = png[pos + 4 : pos + 8], png[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            chunks.append(body)
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and colour in (2, 6) and interlace == 0, (depth, colour, interlace)
    bpp = 3 if colour == 2 else 4
    raw = zlib.decompress(b"".join(chunks))
    stride = width * bpp
    prev = bytearray(stride)
    pixels: list[tuple[int, int, int]] = []
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        if kind == 1:
            for x in range(bpp, stride):
                line[x] = (line[x] + line[x - bpp]) & 255
        elif kind == 2:
            line = bytearray((a + b) & 255 for a, b in zip(line, prev, strict=True))
        elif kind == 3:
            for x in range(stride):
                left = line[x - bpp] if x >= bpp else 0
                line[x] = (line[x] + (left + prev[x]) // 2) & 255
        elif kind == 4:
            for x in range(stride):
                a = line[x - bpp] if x >= bpp else 0
                b = prev[x]
                c = prev[x - bpp] if x >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        pixels += zip(line[0::bpp], line[1::bpp], line[2::bpp], strict=True)
        prev = line
    return width, height, pixels


def _rgb(colour: str) -> tuple[int, int, int]:
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


# --- the page for the fake kubelet's node with a GPU failed while allocated to ml/trainer-0 ---


async def test_chromium_draws_the_gpu_failed_while_allocated_to_ml_trainer_0(
    kubelet: FakeKubelet, short_tmp: Path
) -> None:
    trainer = kubelet.node.pods[("ml", "trainer-0")].container("trainer")
    failed = trainer.devices[GPU][0]
    kubelet.make_unhealthy(GPU, failed)
    async with PodResourcesClient(str(kubelet.socket_path)) as client:
        expected_hash = (await take_snapshot(client)).inventory.content_hash

    # The real command, in a process of its own, as an operator runs it.
    page_bytes = await _run(
        sys.executable,
        *("-m", "watcher", "snapshot", "--socket", str(kubelet.socket_path), "--output", "html"),
        *("--node", "node-a"),
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    page = short_tmp / "node.html"
    page.write_bytes(page_bytes)
    source = page_bytes.decode()
    # Self-contained: nothing fetched, nothing run.
    for needle in ("<script", "src=", "href=", "url(", "@import"):
        assert needle not in source.lower(), needle

    dom = _tree(await _dump_dom(page, short_tmp / "profile-dom"))
    elements = dom.walk()
    devices = {e.attrs["data-device"]: e for e in elements if "data-device" in e.attrs}
    gpus = {d: e for d, e in devices.items() if e.attrs["data-resource"] == GPU}
    assert len(gpus) == 8
    tile = gpus[failed]
    assert tile.attrs["data-state"] == "failed" and "s-failed" in tile.attrs["class"].split()
    assert tile.attrs["data-numa"] == "0"
    pods = [e for e in tile.walk() if "data-pod" in e.attrs]
    containers = [e for e in tile.walk() if "data-container" in e.attrs]
    assert [(p.attrs["data-pod"], p.all_text()) for p in pods] == [("ml/trainer-0", "ml/trainer-0")]
    assert [(c.attrs["data-container"], c.all_text()) for c in containers] == [("trainer", "trainer")]
    # The only failed one; the trainer's other GPUs are allocated, the idle ones free.
    states = {d: e.attrs["data-state"] for d, e in gpus.items()}
    assert [d for d, s in states.items() if s == "failed"] == [failed]
    assert all(states[d] == "allocated" for d in trainer.devices[GPU][1:])
    assert sum(1 for s in states.values() if s == "free") == 3
    # Inside NUMA node 0's box, with the node and the inventory hash in the header.
    numa0 = next(e for e in elements if e.tag == "section" and e.attrs.get("data-numa") == "0")
    assert tile in numa0.walk()
    assert next(e for e in elements if "data-node" in e.attrs).all_text() == "Node node-a"
    assert next(e for e in elements if "data-hash" in e.attrs).attrs["data-hash"] == expected_hash
    legend = {e.attrs["data-legend"] for e in elements if "data-legend" in e.attrs}
    assert legend == {"free", "allocated", "failed"}
    cpus = {e.attrs["data-cpu"]: e.attrs for e in elements if "data-cpu" in e.attrs}
    assert len(cpus) == 92
    assert cpus["2"]["data-state"] == "allocated" and cpus["2"]["data-pod"] == "ml/trainer-0"

    # Drawn: the screenshot has the failed colour over far more than the legend's swatch.
    png = await _screenshot(page, short_tmp / "profile-shot", short_tmp / "node.png", (1280, 1000))
    assert len(png) > 10_000
    width, height, pixels = _pixels(png)
    assert (width, height) == (1280, 1000)
    counts = {state: pixels.count(_rgb(colour)) for state, colour in STATE_COLOURS.items()}
    swatch = 14 * 14
    # One tile is 210 x 56+ px; its text covers part of it.
    assert counts["failed"] > 20 * swatch, counts
    assert counts["allocated"] > counts["failed"] and counts["free"] > counts["failed"], counts


def test_the_page_without_a_failure_shows_no_failed_colour_beyond_the_legend() -> None:
    """The control for the pixel count above: a healthy node's page has no failed element."""
    fake = FakeKubelet("/nonexistent", default_node(), seed=1)
    markup = render_html(Snapshot(build(fake.allocatable_response(), fake.list_response())), "n")
    states = {e.attrs["data-state"] for e in _tree(markup).walk() if "data-state" in e.attrs}
    assert "failed" not in states and {"free", "allocated"} <= states


# --- hostile names ---

HOSTILE_POD = "x\"'><script>document.title='pwned'</script><img src=x onerror=\"document.body.dataset.x=1\">"
HOSTILE_CONTAINER = 'c\u202eexe.txt"><b id=injected>'
HOSTILE_DEVICE = 'gpu-</div><div data-state="free" id="forged">'


async def test_hostile_names_are_text_in_chromium_not_markup(short_tmp: Path) -> None:
    fake = FakeKubelet("/nonexistent", default_node(), seed=1)
    fake.add_device(GPU, HOSTILE_DEVICE, [1])
    pod = HOSTILE_POD + "z" * 5000
    fake.allocate("ml", pod, HOSTILE_CONTAINER, devices={GPU: [HOSTILE_DEVICE]}, cpu_ids=[30])
    fake.remove_device(GPU, HOSTILE_DEVICE)  # failed while allocated: drawn with its holder's label
    snap = Snapshot(build(fake.allocatable_response(), fake.list_response()))
    markup = render_html(snap, "node\u202e<script>alert(1)</script>")
    page = short_tmp / "hostile.html"
    page.write_text(markup)

    for tree in (_tree(markup), _tree(await _dump_dom(page, short_tmp / "profile"))):
        elements = tree.walk()
        tags = {e.tag for e in elements}
        assert not tags & {"script", "img", "b"}, tags
        assert not any(e.attrs.get("id") in ("injected", "forged") for e in elements)
        body = next(e for e in elements if e.tag == "body")
        assert "data-x" not in body.attrs
        title = next(e for e in elements if e.tag == "title").all_text()
        assert title == "node\\u202e<script>alert(1)</script>: pod resources"
        # No bidi override reaches the page: it is shown escaped, so it cannot reorder the text.
        assert "\u202e" not in "".join(e.all_text() + "".join(e.attrs.values()) for e in elements)
        # The markup is intact: one element per device, the hostile one failed and labelled.
        devices = [e for e in elements if "data-device" in e.attrs]
        assert len(devices) == len(snap.inventory.devices) + 1
        tile = next(e for e in devices if e.attrs["data-device"] == HOSTILE_DEVICE)
        assert tile.attrs["data-state"] == "failed"
        shown_pod = printable("ml/" + pod)[: MAX_LABEL - 1] + "…"
        pod_labels = [e for e in tile.walk() if "data-pod" in e.attrs]
        assert [(p.attrs["data-pod"], p.all_text()) for p in pod_labels] == [(shown_pod, shown_pod)]
        container = next(e for e in tile.walk() if "data-container" in e.attrs)
        assert container.attrs["data-container"] == 'c\\u202eexe.txt"><b id=injected>'
        # Bounded: no label carries the 5,000-character name (the hash is the page's own, 71 characters).
        long = [(k, v) for e in elements for k, v in e.attrs.items() if len(v) > MAX_LABEL]
        assert not [(k, v) for k, v in long if k.startswith("data-") and k != "data-hash"], long
        assert all(len("".join(e.text)) < 300 for e in elements if e.tag != "style"), "an unbounded text"


async def test_a_look_alike_or_overdrawn_tile_is_shown_as_what_it_is(short_tmp: Path) -> None:
    """A tile whose id is a real GPU's with a zero-width space after it reads differently from the
    real one, a stack of combining marks is shown escaped instead of drawn over its tile, and no
    zero-width, bidi or tag character reaches the page's text or attributes."""
    fake = FakeKubelet("/nonexistent", default_node(), seed=1)
    real = next(i for r, i in fake.node.devices if r == GPU)
    for dev in (real + "\u200b", OVERDRAWN, "GPU-" + "".join(INVISIBLE.values())):
        fake.add_device(GPU, dev, [0])
    fake.allocate("ml", "p\u200f1", "c\u0301", devices={GPU: [OVERDRAWN]})
    markup = render_html(Snapshot(build(fake.allocatable_response(), fake.list_response())), "n\u200b")
    page = short_tmp / "look-alike.html"
    page.write_text(markup)
    overdrawn = "GPU-Z" + "\\u0489\\u030d\\u0346\\u0353" * 2 + "\\u0489\\u03…"  # cut at MAX_LABEL

    for tree in (_tree(markup), _tree(await _dump_dom(page, short_tmp / "profile"))):
        elements = tree.walk()
        shown = [e.all_text() + "".join(e.attrs.values()) for e in elements if e.tag != "style"]
        assert hidden_in("".join(shown), allowed="\n") == []
        tiles = {e.attrs["data-device"]: e for e in elements if "data-device" in e.attrs}
        ids = {
            dev: next(c for c in t.walk() if c.attrs.get("class") == "id").all_text()
            for dev, t in tiles.items()
        }
        assert ids[real] == real and ids[real + "\\u200b"] == real + "\\u200b"
        assert ids[overdrawn] == overdrawn and len(overdrawn) == MAX_LABEL
        (pod,) = [e for e in tiles[overdrawn].walk() if "data-pod" in e.attrs]
        assert pod.all_text() == "ml/p\\u200f1"


def test_allocatable_unknown_draws_holdings_only_and_says_so() -> None:
    fake = FakeKubelet("/nonexistent", default_node(), seed=1)
    held = fake.node.pods[("ml", "trainer-0")].container("trainer").devices[GPU][0]
    fake.make_unhealthy(GPU, held)
    snap = Snapshot(build(None, fake.list_response()), degraded="GetAllocatableResources is disabled")
    elements = _tree(render_html(snap, "n")).walk()
    states = {e.attrs["data-device"]: e.attrs["data-state"] for e in elements if "data-device" in e.attrs}
    # Only what pods hold is known, and none of it can be called failed.
    assert states[held] == "allocated" and set(states.values()) == {"allocated"}
    containers = [c for p in fake.node.pods.values() for c in p.containers]
    assert len(states) == sum(len(ids) for c in containers for ids in c.devices.values())
    note = next(e for e in elements if e.attrs.get("class") == "note").all_text()
    assert "GetAllocatableResources is disabled" in note
