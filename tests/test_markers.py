"""Every test module is classified (tests/conftest.py), so none joins the fast loop unclassified, and a test
left unmarked that starts a process is stopped, naming it. One process: the modules are read with ``ast``."""

import ast
import re
import textwrap
import tomllib
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
REGISTERED = ("process", "browser", "rig", "network")
#: An inner session that starts nothing itself (pytest-benchmark asks git, hg and file about the machine).
QUIET = ("-p", "no:cacheprovider", "-p", "no:benchmark")


@pytest.fixture(scope="module")
def conf(request):
    """tests/conftest.py as pytest loaded it (the one whose audit hook is live)."""
    return request.config.pluginmanager.get_plugin(str(TESTS / "conftest.py"))


def collected_modules(conf):
    """The test modules pytest collects under tests/ (``python_files``' default patterns)."""
    return sorted(conf.module_name(p) for p in TESTS.rglob("*.py") if re.fullmatch(r"test_.*|.*_test", p.stem))


def test_every_test_module_is_in_the_table_and_the_table_names_only_test_modules(conf):
    modules = collected_modules(conf)
    assert len(modules) >= 60
    missing = sorted(set(modules) - set(conf.MODULE_MARKERS))
    assert missing == [], f"classify these in tests/conftest.py's MODULE_MARKERS: {missing}"
    assert sorted(set(conf.MODULE_MARKERS) - set(modules)) == []  # no entry for a module that is gone


def test_every_named_test_exists_and_every_marker_is_registered(conf):
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "--strict-markers" in options["addopts"].split()
    assert sorted(m.split(":")[0] for m in options["markers"]) == sorted(REGISTERED)
    for markers in [*conf.MODULE_MARKERS.values(), *conf.TEST_MARKERS.values()]:
        assert set(markers) <= set(REGISTERED), markers
    functions = {}
    for key in conf.TEST_MARKERS:
        module, function = key.split("::")
        if module not in functions:
            tree = ast.parse((TESTS / f"{module}.py").read_text())
            functions[module] = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert function in functions[module], f"TEST_MARKERS names {key}, which is not a test there"


def test_notebooks_and_unlisted_modules_are_process_and_overrides_win(conf):
    markers_of = conf.markers_of
    assert markers_of(ROOT / "notebooks" / "01_bucket_layouts.ipynb", "") == ("process",)
    assert markers_of(TESTS / "test_no_such_module.py", "test_x") == ("process",)
    assert markers_of(TESTS / "test_training.py", "test_a_done_spec_is_skipped") == ("process", "network")
    assert markers_of(TESTS / "test_training.py", "test_bad_specs_are_refused_before_any_engine_starts") == ()
    assert markers_of(TESTS / "test_planners.py", "test_anything") == ()


def test_a_test_not_marked_process_that_starts_one_fails_naming_it(pytester, request, conf):
    """tests/conftest.py in a pytester session of its own, in this process: a test left unmarked that starts a
    process fails at teardown naming itself and what it started; the same test marked ``process`` passes. The
    inner tests raise the audit event ``subprocess.Popen`` raises, without starting one."""
    pytester.makeconftest((TESTS / "conftest.py").read_text() + textwrap.dedent("""
        MODULE_MARKERS["test_spawns"] = ()
        TEST_MARKERS["test_spawns::test_marked"] = (PROCESS,)
    """))
    pytester.makeini("[pytest]\naddopts = --strict-markers\nmarkers =\n    process\n    browser\n    rig\n    network\n")
    pytester.makepyfile(test_spawns="""
        import sys
        def test_unmarked():
            sys.audit("subprocess.Popen", "true", ["true"], None, None)
        def test_marked():
            sys.audit("subprocess.Popen", "true", ["true"], None, None)
        def test_unmarked_in_one_process():
            assert sum(range(4)) == 6
    """)
    result = pytester.runpytest_inprocess(*QUIET)
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_unmarked *",
                                 "*UnmarkedProcessError: test_spawns.py::test_unmarked starts a process "
                                 "(subprocess.Popen: *true* but is not marked 'process'*TEST_MARKERS*"])
    assert "test_marked starts" not in result.stdout.str()
    assert pytester.runpytest_inprocess("-m", "not process", *QUIET).ret == 1  # the error again
    # This test's own hook heard the inner events too; none started a process.
    assert set(conf._started.pop(request.node.nodeid)) == {"subprocess.Popen: ('true', ['true'], None, None)"}



def test_the_timeline_names_each_file_a_worker_ran_and_the_script_reads_it(pytester, monkeypatch, capsys):
    """With ``$WORKBENCH_TEST_TIMELINE`` set, tests/conftest.py appends each file's span per worker, and
    scripts/test_timeline.py reads them back: busy seconds per worker, and how long the end ran short of workers."""
    import runpy

    timeline = pytester.path / "timeline.txt"
    monkeypatch.setenv("WORKBENCH_TEST_TIMELINE", str(timeline))
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)  # the inner session is no worker of this one
    pytester.makeconftest((TESTS / "conftest.py").read_text() + '\nMODULE_MARKERS.update(test_one=(), test_two=())\n')
    pytester.makeini("[pytest]\nmarkers =\n    process\n    browser\n    rig\n    network\n")
    pytester.makepyfile(test_one="def test_a():\n    pass\ndef test_b():\n    pass\n",
                        test_two="import time\ndef test_c():\n    time.sleep(0.2)\n"
                                 "def test_d():\n    t = time.process_time()\n"
                                 "    while time.process_time() - t < 0.3:\n        pass\n")
    pytester.runpytest_inprocess(*QUIET).assert_outcomes(passed=4)
    lines = [line.split() for line in timeline.read_text().splitlines()]
    assert sorted((w, f) for w, f, *_ in lines) == [("main", "test_one.py"), ("main", "test_two.py")]
    spans = {f: (float(a), float(b), float(cpu)) for _, f, a, b, cpu in lines}
    assert spans["test_one.py"][1] <= spans["test_two.py"][0] and spans["test_two.py"][1] - spans["test_two.py"][0] >= 0.45
    assert spans["test_one.py"][2] < 0.25 <= spans["test_two.py"][2] < 1.0  # the sleep took no CPU, the loop 0.3 s
    monkeypatch.setattr("sys.argv", ["test_timeline.py", str(timeline)])
    runpy.run_path(str(ROOT / "scripts" / "test_timeline.py"), run_name="__main__")
    out = capsys.readouterr().out
    busy = sum(b - a for a, b, _ in spans.values())  # under load the 0.5 s of test_two can take 2 s of wall time
    assert f"main: 2 files, busy {busy:.0f} s" in out and "test_two.py" in out and "fewer than 1 workers busy" in out
    assert "CPU: " in out and out.index("test_two.py", out.index("CPU: ")) < out.index("test_one.py", out.index("CPU: "))


def test_each_file_runs_whole_and_in_order_longest_first(request):
    """scripts/test.sh runs ``-n 2 --dist loadfile`` over the order tests/conftest.py sets: a file's items stay
    together and in their own order (a notebook's cells share one kernel), and the listed long files lead."""
    from conftest import start_rank

    items = request.session.items
    files = [str(item.path) for item in items]
    seen = []
    for f in files:
        if not seen or seen[-1] != f:
            assert f not in seen, f"{f}: its items are split apart"
            seen.append(f)
    ranks = [start_rank(item.path) for item in items]
    assert ranks == sorted(ranks)
    # every module that trains through shared_runs starts before the notebooks that take its runs
    from conftest import FIRST_FILES, LAST_FILES, NBVAL_SWEEPS

    users = {p.relative_to(TESTS.parent).as_posix() for p in TESTS.glob("test_*.py") if "shared_runs" in p.read_text()}
    assert users - {"tests/test_markers.py"} <= set(FIRST_FILES), sorted(users - set(FIRST_FILES))
    assert set(LAST_FILES) == {f"notebooks/{n}.ipynb" for n in NBVAL_SWEEPS}
    for f in {f for f in files if f.endswith(".ipynb")}:
        numbers = [int(i.name.split()[-1]) for i in items if str(i.path) == f and i.name.startswith("Cell ")]
        assert numbers == sorted(numbers), f
