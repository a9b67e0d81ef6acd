//! The web page at `/`: chat, KV inspector and server status, three files
//! of plain HTML, CSS and JavaScript (no library, no build step) compiled
//! into the binary, so the page works offline and matches the server it
//! came from. They hold no data: with `--api-key` they are served without
//! the key and the page asks for it before calling the API.

use axum::extract::Path;
use axum::http::header;
use axum::response::{IntoResponse, Response};

/// (name under `/web/`, content type, content).
const ASSETS: &[(&str, &str, &str)] = &[
    ("app.js", "text/javascript; charset=utf-8", include_str!("../web/app.js")),
    ("app.css", "text/css; charset=utf-8", include_str!("../web/app.css")),
];

const INDEX: &str = include_str!("../web/index.html");

/// Paths served without the API key.
pub fn is_public(path: &str) -> bool {
    path == "/" || path.strip_prefix("/web/").is_some_and(|f| ASSETS.iter().any(|a| a.0 == f))
}

/// Headers of every page file: no caching across server versions, and a
/// policy that lets the page load nothing from elsewhere.
fn page(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'",
            ),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response()
}

/// `GET /`: the page.
pub async fn index() -> Response {
    page("text/html; charset=utf-8", INDEX)
}

/// `GET /web/{file}`: the page's script and style sheet.
pub async fn asset(Path(file): Path<String>) -> Response {
    match ASSETS.iter().find(|a| a.0 == file) {
        Some(&(_, ct, body)) => page(ct, body),
        None => crate::api::not_found().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_paths() {
        assert!(is_public("/"));
        assert!(is_public("/web/app.js"));
        assert!(!is_public("/web/other.js"));
        assert!(!is_public("/v1/models"));
        assert!(!is_public("/metrics"));
    }

    /// The page loads only its own files (nothing from a CDN).
    #[test]
    fn page_is_self_contained() {
        for text in [INDEX, ASSETS[0].2, ASSETS[1].2] {
            assert!(!text.contains("http://") && !text.contains("https://"), "no remote URL in the page");
        }
        assert!(INDEX.contains("/web/app.js") && INDEX.contains("/web/app.css"));
    }
}
