"""Every ```bash block of the README and the guides in docs/ runs, as a user would paste it, and succeeds.

Each document's bash blocks run in order as one script (`set -euo pipefail`) in a fresh directory, so a later
block may use what an earlier one made. Blocks fenced without `bash` are shown, not run: the whole test suite,
comparisons that take hours, machines this one is not. So that the suite stays short, `fp4lm train` runs a
smaller model than the one a command names (SHRINK, inserted before the command's own overrides, so a
command that sets a size keeps it); a command that starts from a Hugging Face checkpoint
(`train.init_from`) runs as written, its model being the checkpoint's.
"""

import pathlib
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.reliability.helpers_reliability import subprocess_env

pytestmark = pytest.mark.slow  # a dozen small training runs
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHRINK = (
    "model.num_layers=1 model.d_model=32 model.num_heads=2 model.num_kv_heads=1 model.mlp_dim=64 "
    "data.seq_len=32 train.batch_size=8 eval.batches=2"
)

# `fp4lm train` through a shell function: SHRINK goes after the optional leading CONFIG.yaml.
PRELUDE = f"""set -euo pipefail
fp4lm() {{
  if [ "${{1:-}}" = train ] && [[ " $* " != *" train.init_from="* ]]; then
    shift
    local config=()
    if [ $# -gt 0 ] && [[ "$1" != *=* ]] && [[ "$1" != -* ]]; then config=("$1"); shift; fi
    command fp4lm train "${{config[@]}}" {SHRINK} train.compilation_cache_dir="$DOCS_COMPILE_CACHE" "$@"
  else
    command fp4lm "$@"
  fi
}}
"""


def bash_blocks(path: pathlib.Path) -> list[str]:
    """The ```bash fenced blocks of a markdown file, in order."""
    return re.findall(r"^```bash\n(.*?)^```$", path.read_text(), flags=re.DOTALL | re.MULTILINE)


def documents_with_commands() -> list[pathlib.Path]:
    return [path for path in DOCUMENTS if bash_blocks(path)]


def test_the_guides_that_show_commands_run_them():
    """The guides a user follows step by step keep their commands in ```bash blocks, so this module runs them."""
    names = {path.name for path in documents_with_commands()}
    assert {"training.md", "data.md", "export.md", "recipes.md", "multi-host.md", "projection.md"} <= names


def test_a_failing_command_fails_its_document(tmp_path):
    """The runner itself: a command that fails stops the script with its exit status (set -e)."""
    done = run_script("fp4lm train not-a-config.yaml\necho unreachable\n", tmp_path)
    assert done.returncode != 0 and "unreachable" not in done.stdout


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory) -> pathlib.Path:
    """One persistent compilation cache for every document: their small models compile to the same programs."""
    return tmp_path_factory.mktemp("jax-cache")


def run_script(commands: str, cwd: pathlib.Path, cache: pathlib.Path | None = None) -> subprocess.CompletedProcess:
    env = subprocess_env()
    env["DOCS_COMPILE_CACHE"] = str(cache or cwd / ".jax-cache")
    env["PATH"] = f"{pathlib.Path(sys.executable).parent}:{env['PATH']}"
    script = PRELUDE + commands
    return subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=1200)


@pytest.mark.parametrize("path", documents_with_commands(), ids=lambda p: str(p.relative_to(REPO)))
def test_the_commands_of_each_document_run(path, tmp_path, compile_cache):
    done = run_script("\n".join(bash_blocks(path)), tmp_path, compile_cache)
    assert done.returncode == 0, f"{path.name}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def test_the_planning_guide_shows_what_fp4lm_plan_prints(tmp_path):
    """The table under the plan command in docs/projection.md is that command's output at 4,096 GPUs."""
    guide = REPO / "docs" / "projection.md"
    rows = re.findall(r"^\| (\w+) \| ([\d.]+) \| ([\d.]+M) \| (\$[\d.]+M) \| ([\d,]+ MWh) \|$", guide.read_text(), re.M)
    assert [row[0] for row in rows] == ["bf16", "fp8", "mxfp8", "nvfp4"]
    plan = next(block for block in bash_blocks(guide) if block.startswith("fp4lm plan"))
    done = run_script(plan, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = {line.split()[1]: line.split() for line in done.stdout.splitlines() if line.split()[:1] == ["4,096"]}
    for recipe, days, gpu_hours, cost, energy in rows:
        line = printed[recipe]
        assert [line[5], line[7], line[8], " ".join(line[9:11])] == [days, gpu_hours, cost, energy], line
