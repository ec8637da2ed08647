"""Unit tests of the harness's pure parts: matrix rules, statistics, output parsers, run order.
Run: /usr/bin/python3 -m unittest discover -s bench/tests   (no root, no model, ~2 s)."""
from __future__ import annotations

import os
import sys
import tempfile
import textwrap
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from moebench import config, harness, models, runners, stats, system  # noqa: E402

EXP_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments")


def load_toml(text: str) -> config.Experiment:
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(textwrap.dedent(text))
    try:
        return config.load(f.name)
    finally:
        os.unlink(f.name)


# Two cells that differ only in the commit moestream is built at.
BEFORE_AFTER_TOML = """
    [[cell]]
    name = "before"
    commit = "HEAD"
    [[cell]]
    name = "after"
    baseline = "before"
"""


class MatrixRules(unittest.TestCase):
    def test_every_shipped_experiment_is_valid(self):
        for name in os.listdir(EXP_DIR):
            if name.endswith(".toml"):
                config.load(os.path.join(EXP_DIR, name))

    def test_two_changes_are_refused(self):
        with self.assertRaisesRegex(config.ConfigError, "changes 2 variables"):
            load_toml("""
                [[cell]]
                name = "a"
                [[cell]]
                name = "b"
                io_threads = 4
                threads = 1
                baseline = "a"
            """)

    def test_zero_changes_are_refused(self):
        with self.assertRaisesRegex(config.ConfigError, "changes 0 variables"):
            load_toml("""
                [[cell]]
                name = "a"
                [[cell]]
                name = "b"
                baseline = "a"
            """)

    def test_loader_change_ignores_variables_that_do_not_apply(self):
        e = load_toml("""
            [[cell]]
            name = "res"
            loader = "resident"
            [[cell]]
            name = "st"
            io_threads = 8
            baseline = "res"
        """)
        self.assertEqual(config.diff(e.cell("st"), e.cell("res")), [("loader", "resident", "stream")])

    def test_a_one_sided_non_neutral_value_counts(self):
        # stream with a cache vs resident: two changes (loader, and a cache that resident lacks)
        with self.assertRaisesRegex(config.ConfigError, "changes 2 variables"):
            load_toml("""
                [[cell]]
                name = "res"
                loader = "resident"
                [[cell]]
                name = "st"
                cache_mb = 4000
                baseline = "res"
            """)

    def test_sweep_names_and_baselines(self):
        e = load_toml("""
            [[cell]]
            name = "ref"
            loader = "resident"
            [[sweep]]
            vary = "io_threads"
            values = [1, 2, 4]
            name = "l{io_threads}"
            first_baseline = "ref"
        """)
        self.assertEqual([(c.name, c.baseline) for c in e.cells],
                         [("ref", None), ("l1", "ref"), ("l2", "l1"), ("l4", "l1")])

    def test_unknown_variable_is_an_error(self):
        with self.assertRaisesRegex(config.ConfigError, "not a matrix variable"):
            load_toml("""
                [[cell]]
                name = "a"
                lanes = 2
            """)

    def test_attn_gain_names_its_own_model_file(self):
        plain = load_toml("""
            [[cell]]
            name = "a"
            """)
        gained = load_toml("""
            attn_gain = 0.65
            [[cell]]
            name = "a"
            """)
        self.assertEqual(plain.attn_gain, models.DEFAULT_ATTN_GAIN)
        self.assertEqual(gained.attn_gain, 0.65)
        # The default keeps the path models were cached under before the key existed.
        self.assertTrue(models.preset_path("mid", "qwen3moe", "q4_k", 1).endswith("/mid-qwen3moe-q4_k.gguf"))
        self.assertTrue(models.preset_path("mid", "qwen3moe", "q4_k", 1, 0.65)
                        .endswith("/mid-qwen3moe-q4_k-g0.65.gguf"))

    def test_a_commit_is_one_variable_of_a_comparison(self):
        e = load_toml(BEFORE_AFTER_TOML)
        self.assertIn("commit", config.describe_change(e.cell("after"), e.cell("before")))
        with self.assertRaisesRegex(config.ConfigError, "a git revision"):
            load_toml("""
                [[cell]]
                name = "a"
                commit = "rm -rf /"
            """)

    def test_cells_that_name_a_commit_run_the_binary_built_at_it(self):
        e = load_toml(BEFORE_AFTER_TOML)
        repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        h = harness.Harness(e, repo, "/nonexistent/moestream", tempfile.mkdtemp(), tempfile.mkdtemp(),
                            dry_run=True)
        full = harness.resolve_commit(repo, "HEAD")
        self.assertIn(full[:12], h.tools_for(e.cell("before")).moestream)
        self.assertEqual(h.tools_for(e.cell("after")).moestream, "/nonexistent/moestream")
        with self.assertRaises(SystemExit):
            harness.resolve_commit(repo, "no-such-revision-xyz")

    def test_a_split_cell_runs_on_the_first_shard_of_its_set(self):
        e = load_toml("""
            [[cell]]
            name = "merged"
            [[cell]]
            name = "split"
            split = 3
            baseline = "merged"
        """)
        self.assertIn("split: None → 3", config.describe_change(e.cell("split"), e.cell("merged")))
        repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        h = harness.Harness(e, repo, "/bin/true", tempfile.mkdtemp(), tempfile.mkdtemp(), dry_run=True)
        h.tools._run_help = "--io-threads N\n--cache-mb MIB\n--force-cache\n"  # the flags the cell needs
        rec = h.run_one(0, 0, e.cell("split"), None, "/m/x.gguf", {"n_tensors": 579},
                        None, None)
        self.assertEqual(rec["model_shards"], [f"/m/x-split3-0000{k}-of-00003.gguf" for k in (1, 2, 3)])
        self.assertEqual(rec["command"][rec["command"].index("-m") + 1], "/m/x-split3-00001-of-00003.gguf")
        self.assertEqual(models.split_tensor_count(579, 3), 193)
        self.assertEqual(models.split_tensor_count(4, 3), 0)  # 2 per shard gives 2 shards
        with self.assertRaisesRegex(config.ConfigError, "shard count"):
            load_toml("""
                [[cell]]
                name = "a"
                split = 1
            """)

    def test_a_cell_sets_the_openmp_wait_policy(self):
        e = load_toml("""
            [[cell]]
            name = "spin"
            [[cell]]
            name = "sleep"
            omp_wait_policy = "passive"
            baseline = "spin"
        """)
        self.assertEqual(config.describe_change(e.cell("sleep"), e.cell("spin")),
                         "omp_wait_policy: None → passive")
        with self.assertRaisesRegex(config.ConfigError, "omp_wait_policy"):
            load_toml("""
                [[cell]]
                name = "a"
                omp_wait_policy = "spin"
            """)

    def test_a_cell_sets_moestream_env_knobs(self):
        e = load_toml("""
            [[cell]]
            name = "two"
            [[cell]]
            name = "three"
            env = { MOESTREAM_OVERLAP_STAGES = "3" }
            baseline = "two"
            [[cell]]
            name = "res"
            loader = "resident"
            [[cell]]
            name = "mmap"
            loader = "llama-mmap"
        """)
        self.assertEqual(config.describe_change(e.cell("three"), e.cell("two")),
                         "env: {} → {'MOESTREAM_OVERLAP_STAGES': '3'}")
        self.assertTrue(e.cell("res").applies("env"))
        self.assertFalse(e.cell("mmap").applies("env"))
        # one-sided and neutral ({}): not a change between loaders beyond the loader itself
        self.assertEqual([v for v, _, _ in config.diff(e.cell("mmap"), e.cell("res"))], ["loader"])
        # glibc's tunables (the resident reference on huge pages) are the one other name
        load_toml("""
            [[cell]]
            name = "thp"
            loader = "resident"
            env = { GLIBC_TUNABLES = "glibc.malloc.hugetlb=1" }
        """)
        for bad in ('{ OMP_NUM_THREADS = "1" }', '{ MOESTREAM_DEBUG_IO_FAULT = "delay:5" }',
                    '{ MOESTREAM_OVERLAP_STAGES = 3 }', '"MOESTREAM_OVERLAP_STAGES=3"'):
            with self.subTest(bad=bad), self.assertRaisesRegex(config.ConfigError, "env"):
                load_toml(f"""
                    [[cell]]
                    name = "a"
                    env = {bad}
                """)

    def test_a_cell_prompt_of_n_tokens(self):
        e = load_toml("""
            prompt = "Once upon a time"
            [[cell]]
            name = "short"
            [[cell]]
            name = "long"
            prompt_tokens = 1000
            baseline = "short"
        """)
        self.assertEqual(config.prompt_text(e, e.cell("short")), "Once upon a time")
        long = config.prompt_text(e, e.cell("long"))
        self.assertEqual(len(long), 1000)
        self.assertTrue(long.startswith("Once upon a time Once upon a time"))
        self.assertEqual(config.describe_change(e.cell("long"), e.cell("short")),
                         "prompt_tokens: None → 1000")
        # The command carries the cell's prompt, for moestream and llama-completion alike.
        repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        tools = runners.Tools(repo, "/bin/true")
        tools._run_help = "--io-threads N\n--cache-mb MIB\n"
        a, why = runners.moestream_args(tools, e, e.cell("long"), "/m/x.gguf", {}, "/tmp/x")
        self.assertIsNone(why)
        self.assertEqual(a[a.index("-p") + 1], long)
        lc = load_toml("""
            [[cell]]
            name = "l"
            loader = "llama-mmap"
            prompt_tokens = 73
        """)
        b = runners.llama_completion_args(tools, lc, lc.cell("l"), "/m/x.gguf", {})
        self.assertEqual(len(b[b.index("-p") + 1]), 73)
        # prefill_readahead: the flag, which the binary must list.
        ra = load_toml("""
            [[cell]]
            name = "off"
            [[cell]]
            name = "on"
            prefill_readahead = true
            baseline = "off"
        """)
        self.assertEqual(config.describe_change(ra.cell("on"), ra.cell("off")),
                         "prefill_readahead: False → True")
        _, why = runners.moestream_args(tools, ra, ra.cell("on"), "/m/x.gguf", {}, "/tmp/x")
        self.assertIn("--prefill-readahead", why)
        tools._run_help += "--prefill-readahead\n"
        r_on, _ = runners.moestream_args(tools, ra, ra.cell("on"), "/m/x.gguf", {}, "/tmp/x")
        r_off, _ = runners.moestream_args(tools, ra, ra.cell("off"), "/m/x.gguf", {}, "/tmp/x")
        self.assertIn("--prefill-readahead", r_on)
        self.assertNotIn("--prefill-readahead", r_off)
        # batch = 0: no -b, each binary chooses; the default passes -b 512.
        self.assertEqual(a[a.index("-b") + 1], "512")
        e.batch = 0
        a0, _ = runners.moestream_args(tools, e, e.cell("long"), "/m/x.gguf", {}, "/tmp/x")
        self.assertNotIn("-b", a0)
        with self.assertRaisesRegex(config.ConfigError, "batch = -1"):
            load_toml("""
                batch = -1
                [[cell]]
                name = "a"
            """)
        # llama-bench runs no prompt: refused, not ignored; bad lengths refused.
        with self.assertRaisesRegex(config.ConfigError, "prompt_tokens does not apply"):
            load_toml("""
                [[cell]]
                name = "b"
                loader = "bench-mmap"
                prompt_tokens = 1000
            """)
        for bad in ("0", "true", '"long"'):
            with self.assertRaisesRegex(config.ConfigError, "prompt length"):
                load_toml(f"""
                    [[cell]]
                    name = "a"
                    prompt_tokens = {bad}
                """)

    def test_lossy_cells_say_how_often_their_knob_fired(self):
        from moebench import report
        subst = {"name": "s", "params": {"loader": "stream", "extra_args": ["--substitute-experts", "1e-9"]}}
        drop = {"name": "d", "params": {"loader": "stream", "drop_cold": 1e-9}}
        plain = {"name": "p", "params": {"loader": "stream", "extra_args": []}}
        sm = {"experts_substituted": {"mean": 0, "per_rep": [0, 0]},
              "experts_dropped": {"mean": 1.5, "per_rep": [3, 0]}}
        self.assertEqual(report.knob_fired(subst, sm), "; substituted 0, 0 per rep")
        self.assertEqual(report.knob_fired(drop, sm), "; dropped 3, 0 per rep")
        self.assertEqual(report.knob_fired(drop, {}), "; dropped — (no counter)")
        self.assertEqual(report.knob_fired(plain, sm), "")  # control: no knob, no note

    def test_hidden_bound_and_prefill_tables_match_the_fastest_resident_cell_of_the_same_prompt(self):
        from moebench import report
        cells = [
            {"name": "res-73", "params": {"loader": "resident", "threads": 2, "prompt_tokens": 73}},
            {"name": "res-1000", "params": {"loader": "resident", "threads": 2, "prompt_tokens": 1000}},
            {"name": "res-1000-thp", "params": {"loader": "resident", "threads": 2, "prompt_tokens": 1000}},
            {"name": "s-1000", "params": {"loader": "stream", "threads": 2, "io_threads": 4,
                                          "prompt_tokens": 1000}},
        ]
        sm = {
            "res-73": {"decode_tok_s": {"value": 8.0}, "prefill_tok_s": {"mean": 30.0},
                       "n_prompt": {"mean": 73}},
            "res-1000": {"decode_tok_s": {"value": 5.0}, "prefill_tok_s": {"mean": 20.0},
                         "n_prompt": {"mean": 1000}},
            "res-1000-thp": {"decode_tok_s": {"value": 6.0}, "prefill_tok_s": {"mean": 25.0},
                             "n_prompt": {"mean": 1000}},
            "s-1000": {"decode_tok_s": {"value": 2.0}, "mib_read_per_token": {"value": 100.0},
                       "prefill_tok_s": {"mean": 10.0}, "n_prompt": {"mean": 1000},
                       "ttft_s": {"mean": 110.0}, "dense_read_s": {"mean": 5.0},
                       "dense_read_bytes": {"mean": 2000.0 * 2**20},
                       "flash_bytes_read": {"mean": 2.0 * 2**30}},
        }
        res = {"experiment": {"cells": cells}, "summary": {"cells": sm, "fio_mib_s": {"4": {"mean": 1000.0}}}}
        hb = report.hidden_bound_table(res)
        # t_compute from the faster res-1000-thp (1/6 s; res-73's 1/8 is another prompt, res-1000's
        # 0.2 is slower), reads 0.1 s at 1000 MiB/s: bound 0.167, measured 0.5
        self.assertIn("| `s-1000` | 1000 | 0.167 | 100.0 | 0.100 | 0.167 | 0.500 | 3.00 | — | — | — |", hb)
        # Token by token: 3 tokens of 0 MiB and one of 400 MiB (the same 100 MiB mean): the
        # 400-MiB token takes 0.4 s of reads, above its compute: (3 x 0.167 + 0.4) / 4 = 0.225.
        sm["s-1000"]["mib_read_each_token"] = [0, 0, 0, 400]
        # Each rep's longest single read, in ms (runs from before the figures existed: —).
        sm["s-1000"]["read_max_s"] = {"mean": 0.131, "per_rep": [0.012, 0.25]}
        self.assertIn("| 3.00 | 0.225 | 2.22 | 12, 250 |", report.hidden_bound_table(res))
        # Split: the 400-MiB token (0.4 s of reads) took 0.5 s, the other three 0.2 s each
        # against t_compute 1/6: 1 of 4 tokens, all the MiB, 1.25 x its reads, 1.20 x compute;
        # all: 1.1 / (3/6 + 0.4) = 1.22.
        self.assertIsNone(report.read_bound_split_table(res))  # no per-token decode times
        sm["s-1000"]["decode_s_each_token"] = [0.2, 0.2, 0.2, 0.5]
        self.assertIn("| `s-1000` | 1 of 4 | 100% | 1.25 | 1.20 | 1.22 |",
                      report.read_bound_split_table(res))
        # Control: evenly spread reads (100 MiB each, 0.1 s < t_compute) give the plain bound.
        sm["s-1000"]["mib_read_each_token"] = [100] * 4
        self.assertIn("| 3.00 | 0.167 | 3.00 |", report.hidden_bound_table(res))
        self.assertIn("| `s-1000` | 0 of 4 | 0% | — | 1.65 | 1.65 |", report.read_bound_split_table(res))
        pt = report.prefill_table(res)
        # resident prefill 1000 / 25 = 40 s; dense 2000 MiB at fio's 1000 MiB/s = 2 s (not the
        # run's own 5 s): TTFT 110 / (40 + 2) = 2.62
        self.assertIn("| `s-1000` | 1000 | 10.00 | 0.40 | 110.00 | 40.00 (`res-1000-thp`) | 5.00 | "
                      "2.00 | 2.62 | 2.00 |", pt)
        # Without a fio figure the run's own dense read is the read: 110 / (40 + 5) = 2.44.
        res["summary"]["fio_mib_s"] = {}
        self.assertIn("| 5.00 | — | 2.44 |", report.prefill_table(res))
        # Control: an experiment without prompt lengths shows neither (existing pages unchanged).
        for c in cells:
            c["params"].pop("prompt_tokens")
        self.assertIsNone(report.hidden_bound_table(res))
        self.assertIsNone(report.prefill_table(res))

    def test_warm_start_figures_split_the_first_16_decode_tokens_from_the_rest(self):
        from moebench import report
        # 20 decode tokens: the first 16 at 0.5 s with 1 hit in 4 lookups, the rest at 0.25 s.
        pt = {"decode_s": [0.5] * 16 + [0.25] * 4, "cache_hits": [1] * 16 + [4] * 4,
              "cache_misses": [3] * 16 + [0] * 4}
        run = {"metrics": {"per_token": pt, "ttft_s": 9.5, "load_s": 8.0,
                           "stats_json": {"prompt_cache_tokens": 1000, "warm_experts_preloaded": 96}}}
        s: dict = {}
        harness._warm_start_figures(s, [run])
        self.assertAlmostEqual(s["first16_tok_s"]["mean"], 2.0)
        self.assertAlmostEqual(s["steady_tok_s"]["mean"], 4.0)
        self.assertAlmostEqual(s["first16_hit_pct"]["mean"], 25.0)
        self.assertAlmostEqual(s["after_load_s"]["mean"], 1.5)
        s["load_s"] = {"mean": 8.0}
        s["ttft_s"] = {"mean": 9.5}
        res = {"experiment": {"cells": [{"name": "warm"}]}, "summary": {"cells": {"warm": s}}}
        self.assertIn("| `warm` | 1000 | 8.00 | 1.50 (1.50) | 9.50 | 96 | 2.00 (2.00) | 25.0 (25.0) | "
                      "4.00 | 0.50 |", report.warm_table(res))
        # Control: without a restored prompt or a preload the table is not shown.
        for k in ("prompt_cache_tokens", "warm_experts_preloaded"):
            s.pop(k)
        self.assertIsNone(report.warm_table(res))

    def test_parse_bytes(self):
        self.assertEqual(config.parse_bytes("8GiB"), 8 << 30)
        self.assertEqual(config.parse_bytes("512MiB"), 512 << 20)
        self.assertIsNone(config.parse_bytes("none"))

    def test_fio_probe_runs_under_the_one_cap_of_the_capped_cells(self):
        head = """
            [fio_probe]
            lanes = [2]
            capped = %s
            [[cell]]
            name = "resident"
            loader = "resident"
            [[cell]]
            name = "a"
            loader = "stream"
            mem_cap = "8GiB"
            """
        self.assertEqual(harness.fio_cap_bytes(load_toml(head % "true")), 8 << 30)
        self.assertIsNone(harness.fio_cap_bytes(load_toml(head % "false")))
        two = load_toml(head % "true" + """
            [[cell]]
            name = "b"
            loader = "stream"
            mem_cap = "4GiB"
            """)
        self.assertIsNone(harness.fio_cap_bytes(two))
        # The same cap spelled two ways is one cap.
        same = load_toml(head % "true" + """
            [[cell]]
            name = "b"
            loader = "stream"
            mem_cap = 8589934592
            """)
        self.assertEqual(harness.fio_cap_bytes(same), 8 << 30)


    def test_fio_probe_iodepth_queues_reads_through_io_uring(self):
        ins = {"projections": [{"slice_bytes": 5000}],
               "moe_layers": [{"tensors": [{"file_offset": 8192, "tensor_bytes": 1 << 20}]}]}
        deep = runners.fio_args("m.gguf", ins, 4, 4, "o.json", iodepth=8)
        self.assertIn("--ioengine=io_uring", deep)
        self.assertIn("--iodepth=8", deep)
        self.assertIn("--bs=8192", deep)  # one slice, rounded up to 4 KiB
        # Control: the default is one synchronous read per job, as before.
        sync = runners.fio_args("m.gguf", ins, 4, 4, "o.json")
        self.assertIn("--ioengine=psync", sync)
        self.assertFalse([a for a in sync if a.startswith("--iodepth")])
        exp = load_toml("""
            [fio_probe]
            lanes = [4]
            iodepth = 16
            """)
        self.assertEqual(exp.fio.iodepth, 16)
        self.assertEqual(load_toml("[fio_probe]\nlanes = [4]\n").fio.iodepth, 1)
        for bad in ("0", "true", "2.5", "1000"):
            with self.assertRaises(config.ConfigError):
                load_toml(f"[fio_probe]\nlanes = [4]\niodepth = {bad}\n")


class Statistics(unittest.TestCase):
    def test_constant_tokens_give_exact_value_and_zero_width(self):
        r = stats.tok_s([[0.5] * 10, [0.5] * 12])
        self.assertAlmostEqual(r["value"], 2.0)
        self.assertAlmostEqual(r["lo"], 2.0)
        self.assertAlmostEqual(r["hi"], 2.0)

    def test_ratio_of_sums_not_mean_of_ratios(self):
        r = stats.tok_s([[0.1, 0.9]])
        self.assertAlmostEqual(r["value"], 2 / 1.0)   # not (10 + 1.11) / 2

    def test_interval_covers_the_truth_most_of_the_time(self):
        rng = np.random.default_rng(1)
        truth = 1 / 0.2
        covered = 0
        for i in range(200):
            d = [rng.gamma(20, 0.01, size=30)]      # mean 0.2 s/token
            r = stats.tok_s(d, B=1000, seed=i)
            covered += r["lo"] <= truth <= r["hi"]
        self.assertGreater(covered, 170)   # nominal 95%, percentile bootstrap n=30: ~90-95%

    def test_ratio_of_identical_cells_straddles_one(self):
        rng = np.random.default_rng(2)
        a = stats.tok_s([rng.gamma(20, 0.01, size=40)], seed=1)
        b = stats.tok_s([rng.gamma(20, 0.01, size=40)], seed=2)
        r = stats.ratio(a, b)
        self.assertLess(r["lo"], 1.0)
        self.assertGreater(r["hi"], 1.0)

    def test_ratio_detects_a_2x_difference(self):
        rng = np.random.default_rng(3)
        a = stats.tok_s([rng.gamma(20, 0.005, size=30)], seed=1)
        b = stats.tok_s([rng.gamma(20, 0.01, size=30)], seed=2)
        r = stats.ratio(a, b)
        self.assertGreater(r["lo"], 1.5)
        self.assertLess(r["hi"], 2.7)


LLAMA_LOG = """\
0.00.011.488 I llama_completion: load the model and apply lora adapter, if any
0.00.032.140 I system_info: n_threads = 2 (n_threads_batch = 2) / 2 | CPU : AVX2 = 1 |
Once upon a time
0.00.113.852 D n_past = 16
0.00.113.911 D n_remain: 3
0.00.214.973 D n_past = 17
0.00.215.024 D n_remain: 2
0.00.315.704 D n_remain: 1
0.00.417.007 D n_remain: 0
0.00.417.100 I common_perf_print: prompt eval time =      80.00 ms /    16 tokens (    5.00 ms per token,   200.00 tokens per second)
0.00.417.200 I common_perf_print:        eval time =     300.00 ms /     3 runs   (  100.00 ms per token,    10.00 tokens per second)
"""


class Parsers(unittest.TestCase):
    def test_llama_completion_log(self):
        m = runners.parse_llama_completion(LLAMA_LOG)
        self.assertEqual(m["n_generated"], 4)
        self.assertEqual(len(m["per_token"]["decode_s"]), 3)
        self.assertAlmostEqual(m["ttft_s"], 0.113911)
        self.assertAlmostEqual(m["load_s"], 0.032140)
        self.assertAlmostEqual(m["llama_eval_s"], 0.3)
        self.assertAlmostEqual(m["prefill_s"], 0.08)
        self.assertAlmostEqual(m["decode_s"], 0.417007 - 0.113911, places=6)

    def test_minutes_in_llama_timestamps(self):
        m = runners.parse_llama_completion("1.02.003.004 D n_remain: 1\n1.03.003.004 D n_remain: 0\n")
        self.assertAlmostEqual(m["ttft_s"], 62.003004)
        self.assertAlmostEqual(m["per_token"]["decode_s"][0], 1.0)

    def test_moestream_summary(self):
        err = ("moestream: streaming | load 1.11 s | first token 1.35 s | prefill 16 tok 66.70 tok/s | "
               "decode 8 tok 82.08 tok/s\n"
               "moestream: flash read 19.0 MiB in 534 reads (io 0.07 s) | 1.71 MiB/token | token demand "
               "1.69 MiB | widest layer 0.42 MiB\n"
               "moestream: peak RSS 44.0 MiB | major faults/token 0.00 | lossless\n")
        m = runners.parse_moestream_summary(err)
        self.assertEqual(m["n_generated"], 8)
        self.assertAlmostEqual(m["decode_tok_s"], 82.08)
        self.assertAlmostEqual(m["bytes_per_token"], 1.71 * 2**20)
        self.assertEqual(m["flash_reads"], 534)


class Versions(unittest.TestCase):
    def test_lock_packages_are_this_machines_architecture(self):
        import subprocess
        host = subprocess.run(["dpkg", "--print-architecture"], capture_output=True,
                              text=True).stdout.strip()
        other = "arm64" if host != "arm64" else "amd64"
        repo = tempfile.mkdtemp()
        os.makedirs(os.path.join(repo, "deps"))
        with open(os.path.join(repo, "deps", "debian.lock"), "w") as f:
            f.write("# comment\n"
                    f"{host} libllama0 1:0.7.0+dfsg-2 aaaa libllama0.deb\n"
                    f"{other} libllama0 9.9 bbbb libllama0-other.deb\n"
                    f"{host} libc6 2.43 cccc libc6.deb\n")
        v = system.versions(repo, "/nonexistent/moestream", "/bin/false")
        self.assertEqual(v["debian_llama_packages"],
                         {"libllama0": {"version": "1:0.7.0+dfsg-2", "sha256": "aaaa"}})


class Order(unittest.TestCase):
    def _exp(self, order: str) -> config.Experiment:
        return load_toml(f"""
            order = "{order}"
            reps = 3
            [[cell]]
            name = "a"
            [[cell]]
            name = "b"
            io_threads = 4
            baseline = "a"
        """)

    def test_interleaved(self):
        o = harness.run_order(self._exp("interleaved"), ["a", "b"], 0)
        self.assertEqual([n for _, n in o], ["a", "b", "a", "b", "a", "b"])

    def test_alternate(self):
        o = harness.run_order(self._exp("alternate"), ["a", "b"], 0)
        self.assertEqual([n for _, n in o], ["a", "b", "b", "a", "a", "b"])


if __name__ == "__main__":
    unittest.main()
