"""Interleaved A/B of the core sharing (specpipe.engine.cores) at another revision against the working
tree's, in the default configuration, one process: each arm on a generator of its own, the arms in
turn on every prompt, every arm's output must be the same. An arm named ...-nowarm also sets WARM_LAG
out of reach (no drafter warm-ups in rounds without a model draft).

    python3 bench-results/recipes/cores-ab.py --before 05f357b --suite humaneval --limit 20 \
        --arms before,after,before-nowarm
"""

import importlib.util
import os
import subprocess
import tempfile

from arms import arm_parser, arm_prompts, run_arms, write_json

from orchestrator import schedules
from specpipe.app.wiring import embedded_generator
from specpipe.config.services import generator_config
from specpipe.engine import cores

parser = arm_parser(__doc__)
parser.add_argument("--before", required=True, help="the revision whose specpipe/engine/cores.py is the 'before' arm")
parser.add_argument("--arms", default="before,after")
args = parser.parse_args()

source = subprocess.run(["git", "show", f"{args.before}:specpipe/engine/cores.py"], check=True,
                        capture_output=True, text=True).stdout
with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as file:
    file.write(source)
spec = importlib.util.spec_from_file_location("cores_before", file.name)
before_cores = importlib.util.module_from_spec(spec)
spec.loader.exec_module(before_cores)
os.unlink(file.name)
sharing = {"before": (before_cores.forward, before_cores.threads), "after": (cores.forward, cores.threads)}
warm_lag = schedules.WARM_LAG


def before(arm: str) -> None:
    cores.forward, cores.threads = sharing[arm.split("-")[0]]  # the callers look both up at call time
    schedules.WARM_LAG = 10**9 if arm.endswith("-nowarm") else warm_lag


arms = args.arms.split(",")
config = generator_config({"preset": args.preset})
generators = {arm: embedded_generator(config) for arm in arms}
rows, summary = run_arms(generators, arm_prompts(args), args.max_new_tokens, config.speculation, "arm", before=before)
write_json(args.json, args, summary, rows)
