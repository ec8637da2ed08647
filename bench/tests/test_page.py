"""docs/benchmarks.md is generated: `bench/report.py --all` on the committed results renders the
committed page byte for byte, and a change to a results file changes the page.
Run: /usr/bin/python3 -m unittest discover -s bench/tests"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)

from moebench import page  # noqa: E402

RESULTS = os.path.join(BENCH, "results")
DOC = os.path.join(REPO, "docs", "benchmarks.md")


def copy_results(tmp: str) -> None:
    for p in os.listdir(RESULTS):
        if p.endswith(".json"):
            shutil.copy(os.path.join(RESULTS, p), tmp)


def load_json(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def section_of(text: str, name: str) -> str:
    start = text.index(f'<a id="{name}"></a>')
    nxt = text.find('<a id="', start + 1)
    return text[start:nxt if nxt >= 0 else len(text)]


class GeneratedPage(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.rendered = page.render(REPO)

    def test_committed_page_is_what_the_generator_renders(self):
        with open(DOC) as f:
            committed = f.read()
        self.assertEqual(committed, self.rendered,
                         "docs/benchmarks.md is stale or edited by hand: run bench/report.py --all")

    def test_check_command_agrees(self):
        r = subprocess.run([sys.executable, os.path.join(BENCH, "report.py"), "--all", "--check"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_rendering_twice_gives_the_same_bytes(self):
        self.assertEqual(self.rendered, page.render(REPO))

    def test_a_changed_result_changes_its_section_only(self):
        runs = page.newest_runs(RESULTS)
        path = runs["capped-repeating"][0][0]
        with tempfile.TemporaryDirectory() as tmp:
            copy_results(tmp)
            res = load_json(path)
            # slow every kept decode of one cell down: its tok/s must change on the page
            cell = "cache-6000"
            for r in res["runs"]:
                if r.get("cell") == cell:
                    r["metrics"]["per_token"]["decode_s"] = [
                        2 * x if x is not None else x for x in r["metrics"]["per_token"]["decode_s"]]
            with open(os.path.join(tmp, os.path.basename(path)), "w") as f:
                json.dump(res, f)
            changed = page.render(REPO, results_dir=tmp)
        self.assertNotEqual(changed, self.rendered)
        self.assertNotEqual(section_of(changed, "capped-repeating"),
                            section_of(self.rendered, "capped-repeating"))
        self.assertEqual(section_of(changed, "serial-bound"), section_of(self.rendered, "serial-bound"))

    def test_a_newer_run_replaces_the_older_one(self):
        runs = page.newest_runs(RESULTS)
        path, head = runs["stream-lanes"][0]
        with tempfile.TemporaryDirectory() as tmp:
            copy_results(tmp)
            res = load_json(path)
            res["started_utc"] = "2099-01-01T00:00:00Z"
            res["harness_command"] = ["bench/run.py", "--preset", "stream-lanes", "--commit", "feedbee"]
            with open(os.path.join(tmp, "stream-lanes-20990101T000000Z.json"), "w") as f:
                json.dump(res, f)
            # an override run (name with --) and an interrupted run never make the page
            res2 = dict(res, started_utc="2099-02-01T00:00:00Z",
                        harness_command=["bench/run.py", "--preset", "stream-lanes", "--reps", "1"])
            with open(os.path.join(tmp, "stream-lanes--tiny-20990201T000000Z.json"), "w") as f:
                json.dump(res2, f)
            res3 = dict(res, started_utc="2099-03-01T00:00:00Z", interrupted=True,
                        harness_command=["bench/run.py", "--preset", "stream-lanes", "--commit", "badbad"])
            with open(os.path.join(tmp, "stream-lanes-20990301T000000Z.json"), "w") as f:
                json.dump(res3, f)
            sec = section_of(page.render(REPO, results_dir=tmp), "stream-lanes")
        self.assertIn("--commit feedbee", sec)
        self.assertIn(os.path.basename(path), sec)          # listed as an older run
        self.assertNotIn("--reps 1", sec)
        self.assertNotIn("badbad", sec)

    def test_renamed_preset_is_shown_under_its_new_name(self):
        sec = section_of(self.rendered, "capped-repeating")
        self.assertIn("--preset capped-repeating", sec)
        self.assertNotIn("--preset issue4-final", sec)
        self.assertIn('id="capped-repeating"', sec)

    def serve_restart_result(self, ttft_same: float = 0.9) -> dict:
        """A bench/serve_restart.py results file (format 2) over a preset run's machine."""
        path, _ = page.newest_runs(RESULTS)["stream-lanes"][0]
        base = load_json(path)
        reqs = []
        for rep in range(2):
            for kind, ttft, reused, restored in (("cold", 50.0 + rep, 0, 0),
                                                 ("same", ttft_same + rep, 1024, 0),
                                                 ("restart", 1.5 + rep, 0, 1024)):
                reqs.append({"rep": rep, "kind": kind, "load_s": 8.0, "request_to_first_token_s": ttft,
                             "request_s": ttft + 7.0, "lossy": False,
                             "moestream_stats": {"n_prompt": 1055, "n_prompt_reused": reused,
                                                 "prefill_s": ttft - 0.2},
                             "prompt_cache": {"tokens_restored": restored}})
        return {"experiment": "serve-restart", "format": 2, "stamp": "20990101T000000Z",
                "argv": ["bench/serve_restart.py", "--reps", "2"], "model": "/m/q.gguf",
                "prefix_tokens": 1024, "tokens": 32, "reps": 2, "mem_cap": 8 << 30,
                "machine": base["machine"], "versions": base["versions"], "requests": reqs}

    def render_with(self, files: dict) -> str:
        with tempfile.TemporaryDirectory() as tmp:
            copy_results(tmp)
            for name, res in files.items():
                with open(os.path.join(tmp, name), "w") as f:
                    json.dump(res, f)
            return page.render(REPO, results_dir=tmp)

    def test_serve_restart_results_get_a_section_with_each_request_kind(self):
        sec = section_of(self.render_with({"serve-restart-20990101T000000Z.json":
                                           self.serve_restart_result()}), "serve-restart")
        self.assertIn("| cold: nothing cached, the server prefills the whole prompt | 50.50 | 50.00, 51.00 |", sec)
        self.assertIn("| same process: an earlier request of this server cached the prefix | 1.40 | 0.90, 1.90 |", sec)
        self.assertIn("| after a restart: the earlier server run saved the prefix | 2.00 | 1.50, 2.50 |", sec)
        self.assertIn("Method:", sec)
        changed = section_of(self.render_with({"serve-restart-20990101T000000Z.json":
                                               self.serve_restart_result(ttft_same=3.0)}),
                             "serve-restart")
        self.assertNotEqual(changed, sec)  # the figures come from the file

    def test_old_format_serve_restart_results_make_no_section(self):
        # the negative control: the one-request-per-server shape (no "format") is not rendered
        old = dict(self.serve_restart_result())
        del old["format"]
        self.assertNotIn('<a id="serve-restart"></a>',
                         self.render_with({"serve-restart-20990101T000000Z.json": old}))

    def test_no_history_on_the_page(self):
        import re
        bad = re.compile(r"\b[Ss]top[ -]?[0-9]{1,2}\b|issue #[0-9]+|competing engine|competitor|prior-art")
        self.assertEqual(bad.findall(self.rendered), [])


if __name__ == "__main__":
    unittest.main()
