/* Models: the logical parameter counts, tensor names and Hugging Face
 * configs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "vps/model.h"

static void load(struct vps_model *m, const char *name)
{
	CHECK_OK(vps_model_load(m, name, CONFIGS "/models"));
}

/* The Hugging Face counts of each paper model (sum of numel over
 * model.parameters()). */
TEST(parameter_counts_match_hugging_face)
{
	static const struct {
		const char *name;
		int64_t params;
	} want[] = {
		{"llama2-7b", 6738415616LL},      {"llama2-13b", 13015864320LL},
		{"llama2-70b", 68976648192LL},    {"qwen3-30b-a3b", 30532122624LL},
		{"qwen3-235b-a22b", 235093634560LL},
	};
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		struct vps_model m;
		load(&m, want[i].name);
		CHECK_EQ(vps_model_parameters(&m), want[i].params);
	}
}

TEST(every_tensor_name_finds_its_tensor)
{
	const char *models[] = {"tiny-llama", "tiny-gpt", "tiny-qwen3-moe", "qwen3-30b-a3b"};
	for (size_t i = 0; i < sizeof(models) / sizeof(models[0]); i++) {
		struct vps_model m;
		load(&m, models[i]);
		uint32_t n = vps_model_num_tensors(&m);
		for (uint32_t id = 0; id < n; id++) {
			struct vps_tensor t;
			char name[256];
			uint32_t back = UINT32_MAX;
			CHECK_OK(vps_model_tensor(&m, id, &t));
			vps_tensor_name(&t, name, sizeof(name));
			CHECK_OK(vps_model_find_tensor(&m, name, &back));
			CHECK_EQ(back, id);
		}
	}
}

TEST(megatron_registration_order_of_a_llama_layer)
{
	struct vps_model m;
	load(&m, "tiny-llama");
	const char *want[] = {
		"embedding.word_embeddings.weight",
		"decoder.layers.0.self_attention.linear_proj.weight",
		"decoder.layers.0.self_attention.linear_qkv.layer_norm_weight",
		"decoder.layers.0.self_attention.linear_qkv.weight",
		"decoder.layers.0.mlp.linear_fc1.layer_norm_weight",
		"decoder.layers.0.mlp.linear_fc1.weight",
		"decoder.layers.0.mlp.linear_fc2.weight",
		"decoder.layers.1.self_attention.linear_proj.weight",
	};
	for (uint32_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		struct vps_tensor t;
		char name[256];
		CHECK_OK(vps_model_tensor(&m, i, &t));
		vps_tensor_name(&t, name, sizeof(name));
		CHECK(strcmp(name, want[i]) == 0);
	}
	struct vps_tensor last;
	CHECK_OK(vps_model_tensor(&m, vps_model_num_tensors(&m) - 1, &last));
	CHECK(last.kind == VPS_T_OUTPUT_W);
}

TEST(qkv_and_swiglu_get_an_extra_axis)
{
	struct vps_model m;
	load(&m, "tiny-llama");
	struct vps_tensor t;
	uint32_t id;
	CHECK_OK(vps_model_find_tensor(&m, "decoder.layers.3.self_attention.linear_qkv.weight", &id));
	CHECK_OK(vps_model_tensor(&m, id, &t));
	CHECK_EQ(t.ndim, 4);
	CHECK_EQ(t.shape[0], 4);      /* query groups */
	CHECK_EQ(t.shape[1], 2 + 2);  /* 2 q heads per group, k, v */
	CHECK_EQ(t.shape[2], 32);
	CHECK_EQ(t.shape[3], 256);
	CHECK_OK(vps_model_find_tensor(&m, "decoder.layers.3.mlp.linear_fc1.weight", &id));
	CHECK_OK(vps_model_tensor(&m, id, &t));
	CHECK_EQ(t.ndim, 3);
	CHECK_EQ(t.shape[0], 2);
	CHECK_EQ(t.shape[1], 688);
}

TEST(hugging_face_config_json)
{
	const char *json =
		"{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3_moe\",\n"
		" \"hidden_size\": 2048, \"num_hidden_layers\": 48, \"num_attention_heads\": 32,\n"
		" \"num_key_value_heads\": 4, \"head_dim\": 128, \"intermediate_size\": 6144,\n"
		" \"moe_intermediate_size\": 768, \"num_experts\": 128, \"vocab_size\": 151936,\n"
		" \"tie_word_embeddings\": false, \"decoder_sparse_step\": 1, \"mlp_only_layers\": [],\n"
		" \"rope_scaling\": null, \"torch_dtype\": \"bfloat16\"}\n";
	struct vps_model m;
	CHECK_OK(vps_model_parse(&m, "Qwen3-30B-A3B/config.json", json, strlen(json)));
	CHECK_EQ(vps_model_parameters(&m), 30532122624LL);
	CHECK(strcmp(m.name, "Qwen3-30B-A3B") == 0);
	/* LLaMA's MLP biases (LlamaConfig mlp_bias, found by make check-hf:
	 * transformers builds gate/up/down_proj.bias) are refused, as biases on
	 * q/k/v/o are, not dropped */
	const char *bias = "{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 160,\n"
			   " \"num_attention_heads\": 4, \"num_hidden_layers\": 2, \"vocab_size\": 300,\n"
			   " \"mlp_bias\": true}\n";
	CHECK(vps_model_parse(&m, "b/config.json", bias, strlen(bias)) == VPS_EINPUT);
	CHECK(strstr(vps_last_error(), "b/config.json: line 3: mlp_bias: biases on the MLP are not supported") != NULL);
}

TEST(bad_model_is_refused_with_its_line)
{
	const char *yaml = "vps: model\nversion: 1\nname: x\nhidden: 96\nlayers: 2\nheads: 6\n"
			   "query_groups: 4\nffn: 128\nvocab: 100\n";
	struct vps_model m;
	CHECK(vps_model_parse(&m, "x.yaml", yaml, strlen(yaml)) == VPS_EINPUT);
	CHECK(strstr(vps_last_error(), "x.yaml: line 7: query_groups=4 does not divide heads=6") != NULL);
	const char *typo = "vps: model\nversion: 1\nname: x\nhidden: 64\nlayers: 2\nheads: 4\n"
			   "ffn: 128\nvocab: 100\nexpert: 8\n";
	CHECK(vps_model_parse(&m, "x.yaml", typo, strlen(typo)) == VPS_EINPUT);
	CHECK(strstr(vps_last_error(), "x.yaml: line 9: unknown key 'expert'") != NULL);
}

/* Found by fuzz_binary: 4096 layers of 1024 experts (about 17M tensors)
 * were accepted and every tool spent seconds and hundreds of MB building
 * their templates. The real models are far below the bound; refused. */
TEST(models_beyond_a_million_tensors_are_refused)
{
	const char *fmt = "vps: model\nversion: 1\nname: big\nhidden: 64\nlayers: %d\nheads: 4\nquery_groups: 2\n"
			  "head_dim: 16\nvocab: 100\nnorm: rmsnorm\nactivation: swiglu\nposition: rope\n"
			  "experts: %d\nmoe_ffn: 16\n";
	char doc[512];
	struct vps_model m;
	snprintf(doc, sizeof(doc), fmt, 4096, 1024);
	CHECK(vps_model_parse(&m, "big.yaml", doc, strlen(doc)) == VPS_EINPUT);
	CHECK(strstr(vps_last_error(), "big.yaml: line 3: too many tensors (layers x experts): at most 1048576") != NULL);
	snprintf(doc, sizeof(doc), fmt, 512, 256); /* 512 x (24 + 4 x 256) */
	CHECK_OK(vps_model_parse(&m, "ok.yaml", doc, strlen(doc)));
}

/* A Hugging Face model directory, as downloaded: --model takes it and reads
 * its config.json; the model is named by the directory. */
TEST(hugging_face_model_directory)
{
	char dir[] = "/tmp/vps-test-hf-XXXXXX", sub[64], path[96];
	CHECK(mkdtemp(dir) != NULL);
	snprintf(sub, sizeof(sub), "%s/Llama-3-8B", dir);
	CHECK(mkdir(sub, 0700) == 0);
	struct vps_model m;
	/* no config.json yet: named as what it is not */
	CHECK(vps_model_load(&m, sub, CONFIGS "/models") == VPS_ENOTFOUND);
	CHECK(strstr(vps_last_error(), "Llama-3-8B: a directory without config.json") != NULL);
	snprintf(path, sizeof(path), "%s/config.json", sub);
	FILE *f = fopen(path, "w");
	CHECK(f != NULL);
	fputs("{\"model_type\": \"llama\", \"hidden_size\": 4096, \"intermediate_size\": 14336,\n"
	      " \"num_attention_heads\": 32, \"num_hidden_layers\": 32, \"num_key_value_heads\": 8,\n"
	      " \"vocab_size\": 128256, \"tie_word_embeddings\": false}\n", f);
	CHECK(fclose(f) == 0);
	CHECK_OK(vps_model_load(&m, sub, CONFIGS "/models"));
	CHECK(strcmp(m.name, "Llama-3-8B") == 0);
	CHECK_EQ(vps_model_parameters(&m), 8030261248LL);
	/* a trailing slash names the same directory and model */
	char slash[96];
	snprintf(slash, sizeof(slash), "%s/", sub);
	CHECK_OK(vps_model_load(&m, slash, CONFIGS "/models"));
	CHECK(strcmp(m.name, "Llama-3-8B") == 0);
	CHECK(unlink(path) == 0);
	CHECK(rmdir(sub) == 0);
	CHECK(rmdir(dir) == 0);
}

/* A name that is no model says which names are: the .yaml files on the
 * search path, sorted, each once. */
TEST(unknown_model_lists_the_known_ones)
{
	struct vps_model m;
	CHECK(vps_model_load(&m, "llama3-8b", CONFIGS "/models:" CONFIGS "/models") == VPS_ENOTFOUND);
	const char *e = vps_last_error();
	/* what is wrong with the name; the caller says which argument it was */
	CHECK(strncmp(e, "no model named 'llama3-8b'; known: deepseek-v3, gpt3-1.3b, gpt3-2.7b, ", 70) == 0);
	CHECK(strstr(e, ", llama2-7b, llama3-debug, micro-llama, ") != NULL);
	CHECK(strstr(e, ", tiny-deepseek, tiny-gpt, tiny-llama, tiny-qwen3-moe; or a model file, a Hugging Face config.json or its directory") != NULL);
	/* each once though the directory is on the path twice */
	CHECK(strstr(strstr(e, "tiny-llama") + 1, "tiny-llama") == NULL);
	CHECK(vps_model_load(&m, "llama3-8b", "/nonexistent") == VPS_ENOTFOUND);
	CHECK(strstr(vps_last_error(), "(looked for llama3-8b.yaml in /nonexistent; none there)") != NULL);
}
