"""The committed results of the two embedded demos: ``tools/demo.py seg`` and ``det`` (what
``make demo`` and ``make demo-det`` run) each in its own process, their summaries
(``WORK_DIR/demo_summary.json``) stamped with the commit that trained them and written to
benchmarks/results/studies/demo_{seg,det}.json; discussed in docs/reports/demos.md.

    python -m benchmarks.studies.demos            # both
    python -m benchmarks.studies.demos seg
"""
import argparse
import os
import os.path as osp
import subprocess
import sys

from nala_mm.datasets.demo import DEMO_TASKS

from ..lib import report
from ..lib.paths import REPO, STUDY_RESULTS
from ..lib.provenance import code_version
from ..lib.runs import tool_env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('tasks', nargs='*', choices=sorted(DEMO_TASKS),
                        default=sorted(DEMO_TASKS, reverse=True))
    parser.add_argument('--out', default=STUDY_RESULTS)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for task in args.tasks:
        commit = code_version()  # of the code that trains, even if a commit lands meanwhile
        work_dir = osp.join(REPO, DEMO_TASKS[task].work_dir)
        # the tool's own progress and log stream through
        subprocess.run([sys.executable, osp.join(REPO, 'tools', 'demo.py'), task, '--work-dir',
                        work_dir], cwd=REPO, env=tool_env(), check=True)
        summary = report.read_json(osp.join(work_dir, 'demo_summary.json'))
        summary['commit'] = commit
        report.write_json(osp.join(args.out, f'demo_{task}.json'), summary)


if __name__ == '__main__':
    main()
