"""Evaluation: suites from YAML, a runner over any SGLang-speaking endpoint, slime's eval config."""

from aclarena_slime.evaluation.runner import ResultsExist, RunSettings, load_experts, run_suite
from aclarena_slime.evaluation.slime_config import slime_eval_config, write_slime_eval_config
from aclarena_slime.evaluation.suite import EvalDataset, EvalSuite, SuiteError, load_suite, parse_suite

__all__ = [
    "EvalDataset",
    "EvalSuite",
    "ResultsExist",
    "RunSettings",
    "SuiteError",
    "load_experts",
    "load_suite",
    "parse_suite",
    "run_suite",
    "slime_eval_config",
    "write_slime_eval_config",
]
