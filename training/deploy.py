"""Hot-loading an adapter into vLLM: load it on a model server, then prove it answers.

Plain httpx, no Django: reviewapp/learning/deploy.py decides routing around these calls.
"""

import time

import httpx

# Transient: the server is restarting or busy. A 4xx other than these is final.
RETRYABLE_STATUS = {408, 429, 500, 502, 503, 504}


class DeployError(RuntimeError):
    """The adapter could not be served; routing must not change."""


def _post_with_retries(
    client: httpx.Client, url: str, payload: dict, *, attempts: int, backoff_s: float
) -> httpx.Response:
    last_error = ""
    for attempt in range(attempts):
        try:
            response = client.post(url, json=payload)
        except httpx.HTTPError as error:
            last_error = f"{type(error).__name__}: {error}"
        else:
            if response.status_code < 400:
                return response
            last_error = f"HTTP {response.status_code}: {response.text[:300]}"
            if response.status_code not in RETRYABLE_STATUS:
                break
        if attempt + 1 < attempts:
            time.sleep(backoff_s * 2**attempt)
    raise DeployError(f"{url}: {last_error}")


def load_adapter(
    client: httpx.Client,
    base_url: str,
    *,
    name: str,
    path: str,
    attempts: int = 4,
    backoff_s: float = 0.5,
) -> None:
    """POST /v1/load_lora_adapter on one server. A name already loaded from this path counts as
    loaded; one loaded from another path (a server that outlived the database that named it, or a
    second installation on one server) is loaded again in place from this one, so the name never
    answers with another adapter's weights. Raises DeployError when the server did not take it."""
    try:
        models = client.get(f"{base_url.rstrip('/')}/models").json().get("data", [])
        served_from = {model["id"]: model.get("root") for model in models}
    except (httpx.HTTPError, ValueError, KeyError, AttributeError):
        served_from = {}
    if name in served_from and served_from[name] == path:
        return
    payload = {"lora_name": name, "lora_path": path}
    if name in served_from:
        payload["load_inplace"] = True  # vLLM refuses a loaded name otherwise
    _post_with_retries(
        client,
        f"{base_url.rstrip('/')}/load_lora_adapter",
        payload,
        attempts=attempts,
        backoff_s=backoff_s,
    )


def unload_adapter(client: httpx.Client, base_url: str, *, name: str) -> None:
    """POST /v1/unload_lora_adapter on one server; raises DeployError unless it dropped it."""
    response = client.post(f"{base_url.rstrip('/')}/unload_lora_adapter", json={"lora_name": name})
    if response.status_code >= 400:
        raise DeployError(f"unloading {name}: HTTP {response.status_code}: {response.text[:300]}")


def canary_request(client: httpx.Client, base_url: str, *, model: str) -> str:
    """One short completion from the new adapter; raises DeployError unless it answers."""
    response = _post_with_retries(
        client,
        f"{base_url.rstrip('/')}/chat/completions",
        {
            "model": model,
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 4,
            "temperature": 0,
        },
        attempts=2,
        backoff_s=0.5,
    )
    try:
        return response.json()["choices"][0]["message"]["content"] or ""
    except (ValueError, KeyError, IndexError) as error:
        raise DeployError(f"canary answer was not a chat completion: {error}") from None
