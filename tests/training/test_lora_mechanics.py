import torch
from peft import LoraConfig, get_peft_model

from training.losses import masked_token_nll


def _lora(model):
    return get_peft_model(
        model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")
    )


def test_lora_on_all_linear_layers_trains_only_adapter_weights(make_tiny_llama):
    model = _lora(make_tiny_llama())

    trainable = [name for name, param in model.named_parameters() if param.requires_grad]

    assert trainable
    assert all("lora_" in name for name in trainable)
    assert not any("lm_head" in name for name in trainable)


def test_one_optimizer_step_reduces_masked_nll_on_a_fixed_batch(make_tiny_llama):
    model = _lora(make_tiny_llama())
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, model.config.vocab_size, (2, 12), generator=generator)
    loss_mask = torch.zeros(2, 12, dtype=torch.long)
    loss_mask[:, 6:] = 1  # the second half of each sequence is the "assistant turn"
    optimizer = torch.optim.AdamW(
        [param for param in model.parameters() if param.requires_grad], lr=1e-2
    )

    loss_before = masked_token_nll(model(input_ids=input_ids).logits, input_ids, loss_mask)
    loss_before.backward()
    optimizer.step()
    with torch.no_grad():
        loss_after = masked_token_nll(model(input_ids=input_ids).logits, input_ids, loss_mask)

    assert loss_after < loss_before
