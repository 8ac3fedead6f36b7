"""The front door and the docs site: the README stays short, the site builds with
``mkdocs build --strict`` (a broken link or anchor fails it), and the generated flag
reference holds every flag of every study, so the docs cannot drift from the code.

    .venv/bin/python -m pytest tests/test_docs.py
"""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
TOP_BLOCK = """```bash
./env/setup.sh && .venv/bin/python sweeps/neuron_vit.py   # run the main job (here: a ViT sweep on the local CPU)
./env/test.sh                                             # run the tests
```"""


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # mkdocs-material's notice about its successor
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(site)], cwd=config.parent, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    build = mkdocs_build(ROOT / "mkdocs.yml", out)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-5000:]
    return out


def section(html: str, anchor: str) -> str:
    """The built page's text from the heading with this id to the next h2."""
    start = html.index(f'id="{anchor}"')
    end = html.find("<h2", start)
    return html[start:end if end != -1 else len(html)]


def test_readme_is_a_front_door():
    text = README.read_text()
    assert len(text.splitlines()) <= 300, f"README.md has {len(text.splitlines())} lines: the manual goes in docs/"
    assert TOP_BLOCK in text[:600], "README.md must open with the two commands, as they are"


@pytest.mark.slow
def test_the_site_builds_strict(site):
    for page in ("index.html", "main-job/index.html", "reference/flags/index.html", "reference/metrics/index.html"):
        assert (site / page).is_file(), page
    assert (site / "mlflow-ui-parent-run.png").is_file()


@pytest.mark.slow
def test_every_flag_of_every_study_is_in_the_reference(site):
    from accelsweep.sweeps.driver.define.studies import STUDIES, study_parser

    html = (site / "reference" / "flags" / "index.html").read_text()
    assert len(STUDIES) >= 9
    for name in STUDIES:
        shown = section(html, name)
        flags = [flag for action in study_parser(name)._actions for flag in action.option_strings]
        assert flags, name
        missing = [flag for flag in flags if not re.search(rf"{re.escape(flag)}\b", shown)]
        assert not missing, f"study {name}: flags not in the reference page: {missing}"


def shell_blocks(text: str) -> list[str]:
    """The fenced blocks of a Markdown page marked bash, sh or console (or not marked)."""
    blocks, lines, language = [], None, None
    for line in text.splitlines():
        fence = re.match(r"\s*```(\w*)", line)
        if fence and lines is None:
            lines, language = [], fence.group(1)
        elif fence:
            if language in ("", "bash", "sh", "console"):
                blocks.append("\n".join(lines))
            lines = None
        elif lines is not None:
            lines.append(line)
    return blocks


def study_command_lines(text: str) -> list[tuple[str, str]]:
    """(study, the rest of its command line) for each study a shell block runs, by
    ``accelsweep run NAME`` or ``python sweeps/NAME.py``; continued lines joined, the
    comment after `` #`` left out."""
    commands = []
    for block in shell_blocks(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0]
            for found in re.finditer(r"(?:accelsweep run (?:--detach )?|sweeps/)([a-z_]+)(?:\.py)?([^&|;]*)", line):
                commands.append((found.group(1), found.group(2)))
    return commands


def test_every_flag_a_shown_command_uses_is_the_studys_own_by_its_whole_name():
    """argparse takes an unambiguous prefix of a flag (``--max-concurrent`` for
    ``--max-concurrent-trials``): a command the docs show with one works until a second
    flag shares the prefix. Each must be a flag of its study, spelled out."""
    from accelsweep.sweeps.driver.define.studies import STUDIES, study_parser

    flags = {name: {flag for action in study_parser(name)._actions for flag in action.option_strings}
             for name in STUDIES}
    checked, wrong = 0, []
    for page in [README, *sorted(DOCS.glob("*.md"))]:
        for study, rest in study_command_lines(page.read_text()):
            if study not in flags:
                continue  # a path such as sweeps/driver/, not a study
            for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", rest):
                checked += 1
                if flag not in flags[study]:
                    wrong.append(f"{page.name}: {study} {flag}")
    assert checked > 20, checked  # the pages show many commands: the reading found them
    assert not wrong, wrong


@pytest.mark.slow
def test_every_declared_metric_is_in_the_reference(site):
    from accelsweep.trainables import metrics

    html = (site / "reference" / "metrics" / "index.html").read_text()
    declared = [*metrics.TRAINING_METRICS, *metrics.KERNEL_METRICS, *metrics.DRIVER_METRICS]
    missing = [m.name for m in declared if f"<code>{m.name}</code>" not in html]
    assert not missing, f"metrics not in the reference page: {missing}"


@pytest.mark.parametrize("link, found", [
    ("[fine](index.md#a-heading)", None),
    ("[broken anchor](index.md#no-such-heading)", "does not contain an anchor"),
    ("[broken link](no-such-page.md)", "not found among documentation files"),
], ids=["control", "anchor", "link"])
def test_the_strict_build_fails_on_a_broken_link_or_anchor(tmp_path, link, found):
    """The site's own link and anchor checks (mkdocs.yml's ``validation``), on a copy of its
    config with two small pages instead of the real ones."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    config.pop("hooks")
    config["nav"] = ["index.md", "other.md"]
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# Home\n\n## A heading\n\ntext\n")
    (tmp_path / "docs" / "other.md").write_text(f"# Other\n\nSee {link}.\n")
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    build = mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    output = build.stdout + build.stderr
    if found is None:
        assert build.returncode == 0, output[-3000:]
    else:
        assert build.returncode != 0 and found in output, output[-3000:]


def test_shown_servers_bind_localhost_only():
    """Every MLflow server or UI the README and the docs show binds 127.0.0.1 (the tool
    starts none; whoever copies a command gets no open port)."""
    pages = [README, *DOCS.rglob("*.md")]
    commands = [(page.name, line) for page in pages for line in page.read_text().splitlines()
                if re.search(r"mlflow (ui|server)\b", line)]
    assert len(commands) >= 4, commands
    for name, line in commands:
        assert "--host 127.0.0.1" in line, f"{name}: {line}"
    for page in pages:
        assert "0.0.0.0" not in page.read_text(), page.name


def test_the_hook_names_a_module_it_cannot_import():
    from mkdocs.exceptions import PluginError

    spec = importlib.util.spec_from_file_location("docs_reference_hook", DOCS / "hooks" / "reference.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    with pytest.raises(PluginError, match="accelsweep.no_such_module"):
        hook._import("accelsweep.no_such_module")
    assert hook._escape("a|b `c|d` <op> *x* a_b_") == r"a\|b `c\|d` &lt;op\> \*x\* a\_b\_"
