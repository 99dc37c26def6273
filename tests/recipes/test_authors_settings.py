"""The paper recipes train search and retail as the ACLArena authors do: protocol, reward, filters, services."""

from __future__ import annotations

from pathlib import Path

from aclarena_envs.retail.shaping import RetailShaping
from aclarena_envs.retail.user_sim import LLMUserSettings
from aclarena_envs.search.config import SearchConfig
from aclarena_slime.recipes.compiler import compile_recipe
from aclarena_slime.recipes.compose import load_recipe

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def compiled(name: str, tmp: Path):
    return compile_recipe(load_recipe(RECIPES / f"{name}.yaml", [f"paths.root={tmp}"]))


def flag_value(argv: list[str], flag: str) -> list[str]:
    at = argv.index(flag)
    return [arg for arg in argv[at + 1 : at + 2] if not arg.startswith("--")]


def test_search_recipes_use_the_tool_protocol_shaped_reward_no_tool_filter_and_e5(tmp_path: Path):
    for name in ("stage2_search", "oracle_search", "mle_search"):
        command = compiled(name, tmp_path)
        search = command.custom_config["aclarena_env_config"]["search"]
        cfg = SearchConfig.from_mapping(search)  # the env accepts what the recipe sends
        assert (cfg.protocol, cfg.reward, cfg.topk, cfg.max_turns) == ("tool_call", "shaped_effective", 3, 5)
        argv = command.train_args
        assert flag_value(argv, "--dynamic-sampling-filter-path") == ["aclarena_slime.slime_edge.rollout.drop_no_tool"]
        retriever = " ".join(map(str, command.services["retriever"].command))
        assert "--e5-model" in retriever and "e5-base-v2" in retriever and "e5_Flat.index" in retriever


def test_retail_recipes_use_the_shaping_the_variance_filter_and_the_glm_user(tmp_path: Path):
    for name in ("stage3_retail", "oracle_retail", "mle_retail"):
        command = compiled(name, tmp_path)
        retail = command.custom_config["aclarena_env_config"]["retail"]
        assert RetailShaping.from_config(retail["shaping"]) == RetailShaping(0.1, 0.0, -0.2, -0.3, user_failure=-0.3)
        user = retail["user"]
        LLMUserSettings.from_mapping(user)  # the simulator accepts every key the recipe sends
        assert (user["model"], user["temperature"], user["max_tokens"]) == ("user_sim", 0.7, 1024)
        argv = command.train_args
        expected = ["aclarena_slime.slime_edge.rollout.task_reward_nonzero_std"]
        assert flag_value(argv, "--dynamic-sampling-filter-path") == expected
        # Qwen3-Base ends on <|endoftext|> only: a reply to the customer must stop on <|im_end|> (151645)
        assert flag_value(argv, "--rollout-stop-token-ids") == ["151645"]
        assert retail["first_call_only"] is True and retail["shaping"]["user_failure"] == -0.3
        sim = [str(part) for part in command.services["user_sim"].command]
        assert sim[sim.index("--model-path") + 1].endswith("GLM-4.7-Flash")
        assert sim[sim.index("--served-model-name") + 1] == "user_sim"


def test_retail_engines_leave_room_for_training_on_the_shared_node(tmp_path: Path):
    """The policy's engine and the user simulator share the head node's GPUs: their static memory
    fractions add up, and the authors keep the sum at or below 0.85 (run_qwen3_8B_lora.sh:356-369)."""
    for name in ("stage3_retail", "mle_retail", "oracle_retail"):
        command = compiled(name, tmp_path)
        actor = float(flag_value(command.train_args, "--sglang-mem-fraction-static")[0])
        sim = [str(part) for part in command.services["user_sim"].command]
        assert actor + float(sim[sim.index("--mem-fraction-static") + 1]) <= 0.85
