"""docs/catalogue.md stays honest, and every relative link of the docs resolves.

The catalogue must name every algorithm of the registry, every option of their constructors, every hyper-parameter
the configuration validates (with the interval the validation enforces), every protocol, refill and aggregation the
configuration accepts, every ``DelayModel`` field (with its default) and every paper preset. Every relative link in
``docs/*.md`` and ``README.md`` must point to an existing file and, for a Markdown target, to one of its headings
(GitHub's anchor slugs). No JAX program is compiled: the algorithms are only constructed.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import pathlib
import re

import pytest

from asyncfl_jax import config
from asyncfl_jax.algorithms import REGISTRY, staleness
from asyncfl_jax.algorithms.cache import CACHE_KINDS
from asyncfl_jax.algorithms.compression import COMPRESSOR_OPTIONS, COMPRESSORS
from asyncfl_jax.client import LOCAL_HPARAMS
from asyncfl_jax.presets import PRESETS
from asyncfl_jax.timing import delays, protocols

ROOT = pathlib.Path(__file__).resolve().parents[1]
CATALOGUE = ROOT / "docs" / "catalogue.md"
LINKED_DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_INLINE_LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
_HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.I)
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


# ---------------------------------------------------------------------------------------------------- Markdown helpers
def prose_lines(markdown: str) -> list[str]:
    """The lines of ``markdown`` outside fenced code blocks."""
    lines, fenced = [], False
    for line in markdown.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def heading_text(raw: str) -> str:
    """The text GitHub renders for a heading: code spans keep their content, links and images their text, emphasis
    markers and HTML tags are dropped."""
    text = _CODE_SPAN.sub(lambda m: m.group(2).strip(), raw)
    text = _INLINE_LINK.sub(lambda m: m.group(1), text)
    text = re.sub(r"<[^>]+>", "", text)
    return text.replace("*", "")


def github_slug(text: str) -> str:
    """GitHub's anchor for a heading text: lower case, every character that is not a letter, digit, space, hyphen or
    underscore removed, spaces turned into hyphens."""
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """Every anchor a Markdown file defines: its headings' slugs (a repeated slug gets ``-1``, ``-2``, ... as on
    GitHub) and explicit ``<a name=...>`` / ``<a id=...>`` anchors."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in prose_lines(markdown):
        found.update(_HTML_ANCHOR.findall(line))
        m = _HEADING.match(line)
        if not m:
            continue
        slug = github_slug(heading_text(m.group(2)))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def relative_links(markdown: str) -> list[str]:
    """The targets of the inline links, images and reference definitions outside code that are not absolute URLs
    (``#anchor`` links included)."""
    targets = []
    for line in prose_lines(markdown):
        ref = _REFERENCE_DEF.match(line)
        if ref:
            targets.append(ref.group(1))
            continue
        targets.extend(m.group(2) for m in _INLINE_LINK.finditer(_CODE_SPAN.sub("", line)))
    return [t for t in targets if t and not _SCHEME.match(t)]


def broken_links(doc: pathlib.Path) -> list[str]:
    """The relative links of ``doc`` whose file or anchor does not exist, with the reason."""
    problems = []
    for target in relative_links(doc.read_text()):
        path_part, _, anchor = target.partition("#")
        path = (doc.parent / path_part).resolve() if path_part else doc
        if not path.exists():
            problems.append(f"{target}: no file {path_part!r}")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path.read_text()):
            problems.append(f"{target}: {path.name} has no heading with anchor #{anchor}")
    return problems


# ---------------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def catalogue() -> str:
    assert CATALOGUE.exists(), "docs/catalogue.md is missing"
    return CATALOGUE.read_text()


def table_row(text: str, name: str) -> str:
    """The first table row of ``text`` whose first cell is the code span ``name``."""
    for line in text.splitlines():
        if line.startswith(f"| `{name}` |"):
            return line
    raise AssertionError(f"no table row starting with `{name}` in docs/catalogue.md")


def interval(name: str) -> str:
    """The allowed interval of hyper-parameter ``name`` as the configuration's validation writes it."""
    low, high, low_in, high_in = config.HPARAM_RANGES[name]
    return f"{'[' if low_in else '('}{low:g}, {high:g}{']' if high_in else ')'}"


# ---------------------------------------------------------------------------------------------------- the catalogue
def test_every_registered_algorithm_is_catalogued(catalogue):
    missing = [name for name in REGISTRY if f"`{name}`" not in catalogue]
    assert not missing, f"algorithms of the registry missing from docs/catalogue.md: {missing}"


def test_every_constructor_option_is_catalogued(catalogue):
    names = {"compressor", "error_feedback", "compression_seed", *COMPRESSOR_OPTIONS}
    for make in REGISTRY.values():
        names.update(p.name for p in inspect.signature(make).parameters.values()
                     if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL))
    missing = sorted(name for name in names if f"`{name}" not in catalogue)
    assert not missing, f"algorithm options missing from docs/catalogue.md: {missing}"


def test_every_hyperparameter_is_catalogued_with_its_range(catalogue):
    names = set(config.HPARAM_RANGES) | set(LOCAL_HPARAMS)
    for make in REGISTRY.values():
        names.update(make().hyperparams)
    for defaults in staleness.STALENESS_HPARAMS.values():
        names.update(defaults)
    missing = sorted(name for name in names if f"`{name}`" not in catalogue)
    assert not missing, f"hyper-parameters missing from docs/catalogue.md: {missing}"
    for name in config.HPARAM_RANGES:
        assert f"`{interval(name)}`" in table_row(catalogue, name), (
            f"the hyper-parameter table must give {name}'s allowed interval as `{interval(name)}`")


def test_every_protocol_and_protocol_option_is_catalogued(catalogue):
    names = {*config.PROTOCOLS, *protocols.PROTOCOLS, *config.REFILLS, *config.AGGREGATIONS,
             *(f.name for f in dataclasses.fields(config.ProtocolConfig)), "schedule_files"}
    missing = sorted(name for name in names if f"`{name}`" not in catalogue)
    assert not missing, f"protocols or protocol options missing from docs/catalogue.md: {missing}"


def test_every_delay_model_field_is_catalogued_with_its_default(catalogue):
    for choice in (*delays.SPEEDS, *delays.NOISES, *delays.COMBINES):
        assert f"`{choice}`" in catalogue, f"delay-model choice {choice!r} missing from docs/catalogue.md"
    for field in dataclasses.fields(delays.DelayModel):
        default = field.default
        shown = f"`{default:g}`" if isinstance(default, float) else f"`{default}`"
        assert shown in table_row(catalogue, field.name), (
            f"the DelayModel table must give {field.name}'s default as {shown}")


def test_staleness_functions_caches_compressors_and_presets_are_catalogued(catalogue):
    names = {*staleness.STALENESS_FUNCTIONS, *CACHE_KINDS, *COMPRESSORS}
    missing = sorted(name for name in names if f"`{name}`" not in catalogue)
    assert not missing, f"names missing from docs/catalogue.md: {missing}"
    for preset in PRESETS:  # written as <paper>/<task>/<method> with the tasks listed beside it
        paper, task, method = preset.split("/")
        assert f"{paper}/<task>/{method}" in catalogue or preset in catalogue, f"preset {preset} missing"
        assert f"`{task}`" in catalogue, f"preset task {task!r} missing"


def test_catalogue_is_linked_from_simulator_md_and_readme():
    assert "(catalogue.md)" in (ROOT / "docs" / "simulator.md").read_text()
    assert "(docs/catalogue.md)" in (ROOT / "README.md").read_text()


# ---------------------------------------------------------------------------------------------------- links
def test_github_slugs():
    assert github_slug(heading_text("In-scan event clock (`asyncfl_jax.timing.clock`)")) == \
        "in-scan-event-clock-asyncfl_jaxtimingclock"
    assert github_slug(heading_text("Paper presets (`asyncfl run --preset`, `asyncfl_jax.presets`)")) == \
        "paper-presets-asyncfl-run---preset-asyncfl_jaxpresets"
    assert github_slug(heading_text("Demonstration: do the **bias-correcting** methods help?")) == \
        "demonstration-do-the-bias-correcting-methods-help"
    assert github_slug(heading_text("See [the catalogue](catalogue.md) — 2x")) == "see-the-catalogue--2x"
    assert anchors("# A\n## A\n```\n# A\n```\n### A\n") == {"a", "a-1", "a-2"}


def test_relative_links_are_found_outside_code():
    text = "[x](a.md#b) `[no](c.md)` ![i](img.png) [w](https://e.org/x.md) [s](#here)\n```\n[no](d.md)\n```\n"
    assert relative_links(text) == ["a.md#b", "img.png", "#here"]


@pytest.mark.parametrize("doc", LINKED_DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(doc):
    problems = broken_links(doc)
    assert not problems, f"broken links in {doc.relative_to(ROOT)}:\n" + "\n".join(problems)


def test_hyperparameter_intervals_are_formatted_like_the_validation():
    low, high, _, _ = config.HPARAM_RANGES["alpha"]
    assert (low, high) == (0.0, 1.0) and interval("alpha") == "(0, 1]"
    assert interval("server_lr") == f"(0, {math.inf:g})"
