"""The multi-LoRA router: environment tag → LoRA expert, in front of SGLang engines.

- :mod:`.routing`: which adapter a request gets (model name, header, ``lora_path``, classifier, default);
- :mod:`.pool`: the engines, their health, the adapters loaded on each, load spreading;
- :mod:`.gateway`: the endpoints (``aclarena serve-router``), over :mod:`.http1`, a lean HTTP/1.1 server and
  keep-alive client for the proxy path;
- :mod:`.classifier` and :mod:`.tag_prompts`: the optional tag-free expert choice and its data.

At rollout time no gateway is needed: :func:`aclarena_slime.slime_edge.rollout.generate` sets ``lora_path`` per
request from the sample's tag, so one engine pool serves every expert in mixed batches.
"""

from aclarena_slime.router.classifier import TagClassifier
from aclarena_slime.router.gateway import Gateway, build_app
from aclarena_slime.router.pool import EnginePool, NoEngine
from aclarena_slime.router.routing import TAG_HEADER, ExpertResolver, Route, RouteError

__all__ = [
    "TAG_HEADER",
    "EnginePool",
    "Gateway",
    "ExpertResolver",
    "NoEngine",
    "Route",
    "RouteError",
    "TagClassifier",
    "build_app",
]
