//! The tests of the pipeline's back half: partitioning, lowering, the C and CUDA emitters and
//! compilers, the runtimes, the examples and the book. One test binary for all of these files
//! (see `pipeline.rs` for why).

#[path = "../common/mod.rs"]
mod common;

#[path = "../book.rs"]
mod book;
#[path = "../concat.rs"]
mod concat;
#[path = "../concat_in_place.rs"]
mod concat_in_place;
#[path = "../convolution.rs"]
mod convolution;
#[path = "../cpu_backend.rs"]
mod cpu_backend;
#[path = "../cpu_cli.rs"]
mod cpu_cli;
#[path = "../cpu_compiler.rs"]
mod cpu_compiler;
#[path = "../cpu_emit.rs"]
mod cpu_emit;
#[path = "../cpu_gemm.rs"]
mod cpu_gemm;
#[path = "../cuda_compile.rs"]
mod cuda_compile;
#[path = "../cuda_emit.rs"]
mod cuda_emit;
#[path = "../dynamic_dims.rs"]
mod dynamic_dims;
#[path = "../emit_corpus.rs"]
mod emit_corpus;
#[path = "../examples.rs"]
mod examples;
#[path = "../gather.rs"]
mod gather;
#[path = "../gpu_scripts.rs"]
mod gpu_scripts;
#[path = "../hoist.rs"]
mod hoist;
#[path = "../index_maps.rs"]
mod index_maps;
#[path = "../integers.rs"]
mod integers;
#[path = "../lower.rs"]
mod lower;
#[path = "../lt_epilogues.rs"]
mod lt_epilogues;
#[path = "../model_api.rs"]
mod model_api;
#[path = "../numpy_interop.rs"]
mod numpy_interop;
#[path = "../partition.rs"]
mod partition;
#[path = "../rows.rs"]
mod rows;
