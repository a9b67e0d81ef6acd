//! Clients of `kvslim serve`, kept out of the server library: the server
//! only answers HTTP, these send it.
//!
//! * [`clients`]: the server and the clients, as both runs describe them.
//! * [`http_client`]: blocking HTTP helpers over `ureq` for the server's
//!   integration tests and `kvslim loadtest`.
//! * [`load`]: the load generator (`kvslim loadtest`): concurrent
//!   streaming clients, throughput and latency percentiles.
//! * [`prompts`]: prompts of an exact token count cut from a text file
//!   through the server's `/tokenize`.
//! * [`soak`]: the soak driver (`kvslim loadtest --soak`): concurrent
//!   clients mixing normal, cancelled, malformed, oversized and stalled
//!   requests, checked against solo runs, KV and peak memory reported.

pub mod clients;
pub mod http_client;
pub mod load;
pub mod prompts;
pub mod soak;
