"""CI's SGLang part (scripts/ci_sglang.sh, sourced by .ci/run), one function at a time.

The kernel target follows ../shared/sglang-cpu/install.sh's own rule (its flag lists are read from
install.sh, so the two cannot drift apart); where no SGLang can run (no kernel build for the CPU,
a failed install, imports that fail or die) the run says so in one line, leaves
SRPO_GRAPH_REQUIRE_SGLANG unset and goes on under ``set -euo pipefail``; only a ready install
sets it; the last line says which. Each case runs the real bash functions on fake cpuinfo text
and a fake sglang-cpu folder (an install.sh that fails the way a machine makes it fail).
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
INSTALL_SH = ROOT.parent / "shared" / "sglang-cpu" / "install.sh"
V4 = ["avx512f", "avx512_bf16", "amx_tile", "amx_bf16"]
V3 = ["avx2", "fma", "f16c", "bmi2", "movbe"]
BASE = ["fpu", "sse", "sse2", "ssse3", "sse4_1", "sse4_2", "popcnt"]


def cpuinfo(flags: list[str], processors: int = 2, key: str = "flags") -> str:
    """/proc/cpuinfo text for ``processors`` processors with these flags (the kernel's layout)."""
    block = "processor\t: {n}\nvendor_id\t: AuthenticAMD\nmodel name\t: Test CPU\n{key}\t\t: {flags}\n\n"
    return "".join(block.format(n=n, key=key, flags=" ".join(flags)) for n in range(processors))


def bash(script: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """Run ``script`` after sourcing scripts/ci_sglang.sh, under .ci/run's ``set -euo pipefail``."""
    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    full_env = {**os.environ, "CI_LOGS": str(logs), **env}
    return subprocess.run(
        ["bash", "-c", f"set -euo pipefail\n. scripts/ci_sglang.sh\n{script}"],
        cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=120,
    )


def target(tmp_path: Path, text: str) -> str:
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    result = bash(f"ci_cpu_target {path}", tmp_path)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (BASE + V3 + V4 + ["amx_int8", "avx512_vnni"], "x86-64-v4"),  # Intel Xeon, 4th gen and later
        (BASE + V3 + ["avx512f", "avx512_bf16", "avx512_vnni"], "x86-64-v3"),  # AMD EPYC Zen 4: AVX-512, no AMX
        (BASE + V3, "x86-64-v3"),  # AMD EPYC Zen 2/3
        (BASE + ["avx", "avx2"], "none"),  # AVX2 without FMA/F16C/BMI2/MOVBE is not x86-64-v3
        (BASE, "none"),
        (BASE + ["avx512fp16", "avx2_vnni", "amx_tile_x"] + V3[1:], "none"),  # near names are not the flags
    ],
)
def test_cpu_target_from_cpuinfo(tmp_path, flags, expected):
    assert target(tmp_path, cpuinfo(flags)) == expected


def test_cpu_target_of_a_cpuinfo_without_x86_flags_is_none(tmp_path):
    # an Arm machine's /proc/cpuinfo says "Features", not "flags"; a missing file is no CPU either
    assert target(tmp_path, cpuinfo(["fp", "asimd", "avx2"], key="Features")) == "none"
    result = bash(f"ci_cpu_target {tmp_path / 'absent'}", tmp_path)
    assert (result.returncode, result.stdout.strip()) == (0, "none")


def install_sh_flags() -> tuple[list[str], list[str]]:
    """The flags install.sh's own CPU check asks for: (the x86-64-v4 branch, the x86-64-v3 branch)."""
    if not INSTALL_SH.is_file():
        pytest.skip(f"{INSTALL_SH} is not here (a checkout without ../shared/sglang-cpu)")
    text = INSTALL_SH.read_text()
    branches = re.findall(r"^\s*(?:if|elif) (cpu_has .*?); then\s*\n\s*KERNEL_MARCH=(x86-64-v\d)", text, re.M)
    found = {march: re.findall(r"cpu_has (\w+)", cond) for cond, march in branches}
    assert set(found) == {"x86-64-v4", "x86-64-v3"}, f"{INSTALL_SH}: its CPU check changed shape: {branches}"
    return found["x86-64-v4"], found["x86-64-v3"]


def test_cpu_target_agrees_with_install_sh(tmp_path):
    """install.sh picks the kernel build; .ci/run only names it first. For the flags install.sh asks
    for: all of a branch's flags pick it, and any one missing drops to the next."""
    v4, v3 = install_sh_flags()
    assert target(tmp_path, cpuinfo(BASE + v3 + v4)) == "x86-64-v4"
    for flag in v4:
        assert target(tmp_path, cpuinfo(BASE + v3 + [f for f in v4 if f != flag])) == "x86-64-v3", flag
    for flag in v3:
        assert target(tmp_path, cpuinfo(BASE + [f for f in v3 if f != flag])) == "none", flag


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


# .ci/run's sequence: the start in the background, the outcome, the suite, the last line
SEQUENCE = """
ci_sglang_start >"$CI_LOGS/sglang.out" 2>&1 &
pid=$!
wait "$pid" || true
cat "$CI_LOGS/sglang.out"
ci_sglang_outcome
echo "REQUIRE=${SRPO_GRAPH_REQUIRE_SGLANG:-unset}"
echo "the suite runs"
ci_sglang_last_line
"""


def run_sequence(tmp_path: Path, install: str | None, python: str | None, flags: list[str] = BASE + V3):
    """SEQUENCE with a fake sglang-cpu folder whose install.sh is ``install`` (None: no install.sh)
    and a venv python that is ``python`` (None: no venv). SRPO_GRAPH_REQUIRE_SGLANG starts set, as a
    developer's shell may have it, so the outcome has to unset it."""
    sglang_cpu = tmp_path / "sglang-cpu"
    sglang_cpu.mkdir()
    if install is not None:
        executable(sglang_cpu / "install.sh", install)
    venv_python = tmp_path / "venv" / "bin" / "python"
    if python is not None:
        executable(venv_python, python)
    (tmp_path / "cpuinfo").write_text(cpuinfo(flags))
    lines = _sequence_again(tmp_path)
    assert lines[-2:-1] == ["the suite runs"], lines
    return lines


def skipped_lines(lines: list[str]) -> list[str]:
    """The run's lines once SGLang is known not to run: one says why, then the suite, then the last line."""
    assert "REQUIRE=unset" in lines, lines
    assert lines[-1].startswith("SGLang tests skipped ("), lines
    said = [line for line in lines if line.startswith("ci: no SGLang on this machine: ")]
    assert len(said) == 1, lines
    assert "every other test runs" in said[0]
    return said


def test_failed_install_is_one_line_and_the_suite_runs(tmp_path):
    install = "#!/usr/bin/env bash\necho 'E: Unable to locate package libnuma-dev'\nexit 1\n"
    lines = run_sequence(tmp_path, install, None)
    (said,) = skipped_lines(lines)
    assert "install.sh failed (E: Unable to locate package libnuma-dev)" in said
    assert "does not exist" in said  # and the venv's imports were checked: there is no venv


def test_kernel_that_dies_with_sigill_is_one_line_and_the_suite_runs(tmp_path):
    """The venv python is a stand-in that dies of SIGILL (kills itself with the real signal): a kernel
    build for another CPU does this at import, and no CPU here can be made to produce it."""
    lines = run_sequence(tmp_path, "#!/usr/bin/env bash\nexit 0\n", "#!/usr/bin/env bash\nkill -ILL $$\n")
    (said,) = skipped_lines(lines)
    assert "SIGILL (rc 132)" in said


def test_imports_that_fail_after_a_clean_install_are_one_line(tmp_path):
    python = "#!/usr/bin/env bash\necho \"ModuleNotFoundError: No module named 'sgl_kernel'\" >&2\nexit 1\n"
    (said,) = skipped_lines(run_sequence(tmp_path, "#!/usr/bin/env bash\nexit 0\n", python))
    assert "No module named 'sgl_kernel'" in said


def test_cpu_without_a_kernel_build_skips_the_install(tmp_path):
    install = f"#!/usr/bin/env bash\ntouch {tmp_path}/installed\n"
    (said,) = skipped_lines(run_sequence(tmp_path, install, None, flags=BASE))
    assert "no SGLang CPU kernel build for it" in said
    assert not (tmp_path / "installed").exists()


def test_missing_sglang_cpu_folder_is_one_line(tmp_path):
    (said,) = skipped_lines(run_sequence(tmp_path, None, None))
    assert "install.sh not found" in said


def test_ready_install_sets_require_sglang(tmp_path):
    """The venv python is a stand-in that exits 0 (a working SGLang venv is 2.8 GiB and minutes to
    install; test_real_venv_imports below checks the real one where it is installed)."""
    install = "#!/usr/bin/env bash\necho '[install 10:00:00] sglang-kernel-cpu for x86-64-v3 (the CPU has AVX2)'\n"
    lines = run_sequence(tmp_path, install, "#!/usr/bin/env bash\nexit 0\n")
    assert "REQUIRE=1" in lines
    assert not [line for line in lines if "no SGLang" in line]
    assert "ci: [install 10:00:00] sglang-kernel-cpu for x86-64-v3 (the CPU has AVX2)" in lines  # the build it took
    assert lines[-1].startswith("SGLang tests ran (kernel target x86-64-v3")


def _sequence_again(tmp_path: Path) -> list[str]:
    """SEQUENCE on run_sequence's folder, venv and cpuinfo in ``tmp_path`` (again: the next CI run on this machine)."""
    result = bash(
        SEQUENCE, tmp_path,
        SRPO_GRAPH_SGLANG_CPU=str(tmp_path / "sglang-cpu"),
        SRPO_GRAPH_SGLANG_PYTHON=str(tmp_path / "venv" / "bin" / "python"),
        SRPO_GRAPH_CPUINFO=str(tmp_path / "cpuinfo"), SRPO_GRAPH_REQUIRE_SGLANG="1",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.splitlines()


KERNEL_LINE = "[install 10:00:00] sglang-kernel-cpu for x86-64-v3 (the CPU has AVX2)"
COUNT = "#!/usr/bin/env bash\necho run >> \"$(dirname \"$0\")/../installs\"\n"  # an install.sh counting its runs
COUNTING_INSTALL = COUNT + f"echo '{KERNEL_LINE}'\n"


def test_a_venv_this_install_made_is_not_installed_again_until_something_changes(tmp_path):
    """The second run finds the stamp of the first run's clean install: install.sh does not run, the
    log still names the kernel build and the suite requires SGLang. A changed sglang-cpu folder, a
    venv that no longer imports (the stand-in python then fails) or another kernel target installs
    again; a failed install leaves no stamp."""
    installs = tmp_path / "installs"
    python = "#!/usr/bin/env bash\n[ -e \"$(dirname \"$0\")/broken\" ] && exit 1\nexit 0\n"
    first = run_sequence(tmp_path, COUNTING_INSTALL, python)
    assert installs.read_text().count("run") == 1 and "REQUIRE=1" in first
    stamp = tmp_path / "venv" / ".srpo-graph-install"
    assert stamp.read_text().splitlines()[1:] == [KERNEL_LINE]

    again = _sequence_again(tmp_path)
    assert installs.read_text().count("run") == 1, again  # not installed again
    assert "REQUIRE=1" in again and again[-1].startswith("SGLang tests ran (kernel target x86-64-v3"), again
    assert any("not installed again" in line for line in again), again
    assert f"ci: {KERNEL_LINE}" in again  # the build it took

    (tmp_path / "sglang-cpu" / "new.diff").write_text("a patch install.sh now applies\n")
    assert "REQUIRE=1" in _sequence_again(tmp_path) and installs.read_text().count("run") == 2  # the folder changed

    (tmp_path / "cpuinfo").write_text(cpuinfo(BASE + V3 + V4))
    _sequence_again(tmp_path)
    assert installs.read_text().count("run") == 3  # another kernel target
    _sequence_again(tmp_path)
    assert installs.read_text().count("run") == 3  # and stamped for it

    (tmp_path / "venv" / "bin" / "broken").write_text("")
    broken = _sequence_again(tmp_path)
    assert installs.read_text().count("run") == 4 and "REQUIRE=unset" in broken  # checked, installed, still failing
    assert not stamp.exists()
    (tmp_path / "venv" / "bin" / "broken").unlink()
    executable(tmp_path / "sglang-cpu" / "install.sh", COUNT + "exit 1\n")
    assert "REQUIRE=1" in _sequence_again(tmp_path)  # install.sh failed but the venv imports: going on
    assert installs.read_text().count("run") == 5 and not stamp.exists()  # ... unstamped


def test_a_start_that_stopped_without_a_reason_still_skips(tmp_path):
    script = 'ci_sglang_outcome\necho "REQUIRE=${SRPO_GRAPH_REQUIRE_SGLANG:-unset}"\nci_sglang_last_line'
    result = bash(script, tmp_path, SRPO_GRAPH_REQUIRE_SGLANG="1")
    assert result.returncode == 0, result.stderr
    assert "stopped before it was ready" in result.stdout
    assert "REQUIRE=unset" in result.stdout


def test_ci_run_leaves_require_sglang_to_the_outcome():
    """.ci/run sets SRPO_GRAPH_REQUIRE_SGLANG only through ci_sglang_outcome, and parses."""
    text = (ROOT / ".ci" / "run").read_text()
    assert "SRPO_GRAPH_REQUIRE_SGLANG=1" not in text.replace("# With SGLang installed, SRPO_GRAPH_REQUIRE_SGLANG=1", "")
    for call in ("ci_cpu_target_line", "ci_sglang_start", "ci_sglang_outcome", "ci_sglang_last_line", "trap "):
        assert call in text, call
    assert subprocess.run(["bash", "-n", str(ROOT / ".ci" / "run")]).returncode == 0


@pytest.mark.sglang
def test_real_venv_imports(tmp_path):
    """Where the SGLang CPU venv is installed, ci_sglang_imports passes on it (and names why not, where not)."""
    default = Path.home() / ".cache/srpo-graph/sglang-venv/bin/python"
    python = Path(os.environ.get("SRPO_GRAPH_SGLANG_PYTHON") or default)
    if not python.exists():
        pytest.skip(f"no SGLang venv at {python}")
    result = bash("ci_sglang_imports", tmp_path, SRPO_GRAPH_SGLANG_PYTHON=str(python))
    assert result.returncode == 0, result.stdout
