"""Retail requests as a client of the router writes them (τ-retail customer messages), for its tag classifier.

Generated, not drawn from the τ³ data: the router has no env configuration, so no data folder.
"""

from __future__ import annotations

import random

_NAMES = ["Alice", "Ben", "Chen", "Dana", "Emil", "Farah", "Gita", "Hugo", "Ines", "Jun", "Kofi", "Lena"]
_ITEMS = ["mechanical keyboard", "water bottle", "hiking boots", "desk lamp", "t-shirt", "office chair",
          "bluetooth speaker", "backpack", "smart watch", "coffee maker", "laptop sleeve", "wireless earbuds"]  # fmt: skip
_SYSTEM = (
    "You are a customer service agent for an online retail store. Authenticate the user, then help with "
    "orders, returns and exchanges following the policy. Tools: find_user_id_by_email, get_order_details, "
    "cancel_pending_order, return_delivered_order_items.\n"
)


def prompts(n: int, seed: int = 0) -> list[str]:
    """``n`` customer messages, half of them after an agent system prompt (reproducible from ``seed``)."""
    r = random.Random(seed)
    return [_message(r) for _ in range(n)]


def _message(r: random.Random) -> str:
    item, name = r.choice(_ITEMS), r.choice(_NAMES)
    order = f"#W{r.randint(1000000, 9999999)}"
    message = r.choice(
        [
            f"Hi, I want to return the {item} from order {order}.",
            f"I'd like to exchange my {item} for a different color.",
            f"Can you cancel order {order}? I ordered it by mistake.",
            f"My name is {name} Smith and my zip code is {r.randint(10000, 99999)}. I need help with an order.",
            f"Please change the shipping address of my pending order {order}.",
            f"What is the status of my {item} order? It has not arrived yet.",
            f"I was charged twice for the {item}, can I get a refund to my gift card?",
            f"The {item} I received is broken. I want a replacement.",
            f"Could you update the payment method on order {order} to my credit card?",
            f"My email is {name.lower()}@example.com, I want to modify the items in my order.",
        ]
    )
    return r.choice(["", _SYSTEM]) + message
