//! Error responses in OpenAI's shape (`{"error": {"message", "type",
//! "param", "code"}}`) and the request-body helpers that produce them;
//! every handler module answers through these.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

/// An error response in OpenAI's shape.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<&'static str>,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn bad(message: impl Into<String>, param: Option<&'static str>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param,
            code: None,
        }
    }
    pub(crate) fn code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }
    pub(crate) fn body(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}

/// A request body read as JSON of type `T`, or the 400 saying why not.
pub(crate) fn json_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::bad(format!("invalid request: {e}"), None))
}

/// The value of a required request field `name`, or the 400 naming it.
pub(crate) fn required<T>(value: Option<T>, name: &'static str) -> Result<T, ApiError> {
    value.ok_or_else(|| ApiError::bad(format!("`{name}` is required"), Some(name)))
}

/// A handler's JSON answer or its error.
pub(crate) fn reply(r: Result<Value, ApiError>) -> Response {
    match r {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}
