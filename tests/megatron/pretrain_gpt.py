"""A pretrain_gpt.py of Megatron-LM's shape (core_v0.19) whose job vps
switches: its data (Megatron's mock GPT dataset, or --data-path), batches,
loss and forward step are pretrain_gpt.py's, and it starts the job with
pretrain() as pretrain_gpt.py does. The lines vps adds are marked "vps:".

    PYTHONPATH=python torchrun --nproc-per-node 4 tests/megatron/pretrain_gpt.py \\
        MEGATRON-ARGS --vps-control switch.txt --vps-dir run/vps

tests/megatron/check_pretrain.py runs it on the CPU (main(argv), one
forked process per rank) through switches."""
import sys
from functools import partial

import torch

from megatron.core import mpu
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig, MockGPTDataset
from megatron.core.enums import ModelType
from megatron.core.utils import get_attr_wrapped_model, get_batch_on_this_tp_rank
from megatron.training import get_args, get_tokenizer
from megatron.training.argument_utils import gpt_config_from_args, pretrain_cfg_container_from_args
from megatron.training.arguments import parse_and_validate_args
from megatron.training.utils import get_blend_and_blend_per_split, is_first_or_last_pipeline_stage

import vps.megatron_training as vps_mt  # vps: the switchable pretrain() and its arguments

# (iteration, loss sum, tokens) of each training micro-batch this rank's loss
# function saw, for check_pretrain.py (TP rank 0 of the last stage)
LOSSES = []


def get_batch(data_iterator, vp_stage=None):
    args = get_args()
    if not is_first_or_last_pipeline_stage(vp_stage):
        return None, None, None, None, None
    batch = {}
    if mpu.get_tensor_model_parallel_rank() == 0:
        batch = next(data_iterator)
    batch = get_batch_on_this_tp_rank(
        batch, has_cu_seqlens=False, is_hybrid_cp=False,
        create_attention_mask_in_dataloader=args.create_attention_mask_in_dataloader,
        broadcast_src_rank=mpu.get_tensor_model_parallel_src_rank(),
        broadcast_group=mpu.get_tensor_model_parallel_group(), cp_size=args.context_parallel_size,
        tp_rank=mpu.get_tensor_model_parallel_rank(), micro_batch_size=args.micro_batch_size,
        seq_length=args.seq_length, mtp_on_this_rank=False,
        pipeline_model_parallel_size=args.pipeline_model_parallel_size,
        is_pipeline_first_stage=mpu.is_pipeline_first_stage(vp_stage=vp_stage),
        is_pipeline_last_stage=mpu.is_pipeline_last_stage(vp_stage=vp_stage))
    return (batch["tokens"], batch["labels"], batch["loss_mask"], batch.get("attention_mask"),
            batch["position_ids"])


def loss_func(loss_mask, output_tensor, model=None):
    losses = output_tensor.view(-1).float()
    loss_mask = loss_mask.view(-1).float()
    loss = torch.sum(losses * loss_mask)
    num_tokens = loss_mask.sum().clone().detach().to(torch.int)
    if model is not None and model.training and mpu.get_tensor_model_parallel_rank() == 0:
        LOSSES.append((get_args().curr_iteration + 1, loss.item(), num_tokens.item()))
    return loss, num_tokens, {"lm loss": torch.cat([loss.clone().detach().view(1), num_tokens.view(1)])}


def forward_step(data_iterator, model):
    vp_stage = get_attr_wrapped_model(model, "vp_stage")
    tokens, labels, loss_mask, attention_mask, position_ids = get_batch(data_iterator, vp_stage)
    output_tensor = model(tokens, position_ids, attention_mask, labels=labels, loss_mask=loss_mask)
    return output_tensor, partial(loss_func, loss_mask, model=model)


def is_dataset_built_on_rank(vp_stage=None):
    return is_first_or_last_pipeline_stage(vp_stage) and mpu.get_tensor_model_parallel_rank() == 0


def train_valid_test_datasets_provider(train_val_test_num_samples, vp_stage=None):
    args = get_args()
    blend, blend_per_split = get_blend_and_blend_per_split(args)
    config = GPTDatasetConfig(
        random_seed=args.seed, sequence_length=args.seq_length, blend=blend, blend_per_split=blend_per_split,
        split=args.split, path_to_cache=args.data_cache_path, tokenizer=get_tokenizer(),
        reset_position_ids=args.reset_position_ids, reset_attention_mask=args.reset_attention_mask,
        eod_mask_loss=args.eod_mask_loss, create_attention_mask=args.create_attention_mask_in_dataloader,
        mid_level_dataset_surplus=args.mid_level_dataset_surplus)
    dataset_type = MockGPTDataset if args.mock_data else GPTDataset
    return BlendedMegatronDatasetBuilder(dataset_type, train_val_test_num_samples,
                                         partial(is_dataset_built_on_rank, vp_stage=vp_stage), config).build()


train_valid_test_datasets_provider.is_distributed = True


def main(argv=None):
    """The job: Megatron's arguments from argv (sys.argv's by default), then
    pretrain()."""
    if argv is not None:
        sys.argv = [sys.argv[0]] + list(argv)
    # vps: --vps-control, --vps-switch-to and the rest join Megatron's arguments
    args = parse_and_validate_args(extra_args_provider=vps_mt.add_arguments,
                                   args_defaults={"tokenizer_type": "NullTokenizer"})
    full_config = pretrain_cfg_container_from_args(args, gpt_config_from_args(args))
    # vps: in place of megatron.training's pretrain(), which it calls
    vps_mt.pretrain(full_config, train_valid_test_datasets_provider, ModelType.encoder_or_decoder,
                    forward_step)


if __name__ == "__main__":
    main()
