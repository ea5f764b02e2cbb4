"""Take the README's screenshot of the finance dashboard: a gateway and its simulators
on local ports, real calls from three tenants (at prices raised so they cost dollars,
and with budgets, so every column has something to say), then Debian's Chromium signs
in and captures the top of /ui/.

    PYTHONPATH=. .venv/bin/python docs/screenshot.py docs/finance-dashboard.png

Needs the dev dependencies (playwright) and /usr/bin/chromium; nothing is downloaded.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import openai
from playwright.sync_api import sync_playwright

from gateway.auth.keys import key_digest, new_api_key
from tests.support.stack import ADMIN_KEY, running_stack
from tests.support.system_programs import CHROMIUM_ARGS

INITECH_KEY = new_api_key()


def priced_for_show(policy: str) -> str:
    policy = (policy.replace("{input: 2.50, cached_input: 1.25, output: 10.00}", "{input: 2500, cached_input: 1250, output: 10000}")
                    .replace("{input: 0.15, cached_input: 0.075, output: 0.60}", "{input: 400, cached_input: 200, output: 1600}"))
    policy = policy.replace('    api_keys: ["', '    budget: {usd: "60", period: month}\n    api_keys: ["', 1)
    return policy.replace("\nroutes:", f'\n  initech:\n    api_keys: ["{key_digest(INITECH_KEY)}"]\n'
                                       '    budget: {usd: "1.50", period: day}\nroutes:')


def traffic(base_url: str, keys: dict[str, str]) -> None:
    plan = {"acme": [("sim-large", 90), ("auto", 60), ("gpt-4o-mini", 200)] * 3,
            "globex": [("gpt-4o-mini", 180)] * 4, "initech": [("gpt-4o-mini", 40), ("sim-large", 12)]}
    for tenant, calls in plan.items():
        client = openai.OpenAI(base_url=base_url, api_key=keys[tenant], max_retries=0)
        for i, (model, tokens) in enumerate(calls):
            messages: Any = [{"role": "user", "content": f"Summarise invoice batch {i} for {tenant}."}]
            # Seeded, and each asked twice: the repeat is answered from the tenant's
            # response cache, and the saving shows.
            for _ in range(2 if i % 3 == 0 else 1):
                client.chat.completions.create(model=model, messages=messages, max_tokens=tokens, seed=i)


def main(out: Path) -> None:
    with tempfile.TemporaryDirectory() as folder, running_stack(Path(folder), edit_policy=priced_for_show) as stack:
        traffic(stack.gateway, {"acme": stack.key, "globex": stack.other_key, "initech": INITECH_KEY})
        with sync_playwright() as driver:
            browser = driver.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 880})
            page.goto(f"{stack.root}/ui/")
            page.fill("#admin-key", ADMIN_KEY)
            page.click("button[type=submit]")
            page.wait_for_selector("#tenants")
            chart = page.locator("figure.chart-box").bounding_box()
            assert chart is not None
            page.screenshot(path=str(out), full_page=True, clip={"x": 0, "y": 0, "width": 1280, "height": chart["y"] + chart["height"] + 24})
            browser.close()
    print(f"wrote {out} ({out.stat().st_size // 1024} KiB)")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/finance-dashboard.png"))
