//! Chat requests → prompt text and ids, through the model's own chat
//! template ([`kvslim_models::chat`]); the plain `role: content` fallback for
//! models without one.

pub use kvslim_models::chat::{ChatError, ChatFormat, ChatMessage};
