// train_llama on the host: picks the precision's instantiation.
#include "run_host.hpp"

namespace train_llama {

int run_host(options& o, const fs::path& tok, created_paths& created) {
  if (o.parallel) {
    check_before_ranks(o, tok);  // before dp x tp rank threads or processes start
  } else {
    const data::token_file data(tok);
    train::validate<parallel::zero<0>>(model_config(o), run_config(o), data,
                                       comm::device_mesh(1, 1, 1));
    check_host_memory(o, model_config(o), run_config(o));  // before the model is allocated
  }
  if (o.precision == "fp32") return run_host_with<precision::fp32>(o, tok, created);
  if (o.precision == "bf16" || o.precision == "bf16_mixed")
    return run_host_with<precision::bf16_mixed>(o, tok, created);
  if (o.precision == "bf16_mixed_bf16_grads")
    return run_host_with<precision::bf16_mixed_bf16_grads>(o, tok, created);
  if (o.precision == "fp64") return run_host_with<precision::fp64>(o, tok, created);
  throw config_error("unknown precision '" + o.precision +
                     "' (valid: fp32, bf16, bf16_mixed_bf16_grads, fp64)");
}

}  // namespace train_llama
