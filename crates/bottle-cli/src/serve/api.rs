//! The endpoints: routing, reading bounded JSON bodies, and answering JSON.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use bottle_core::display::escape_for_terminal;
use bottle_core::sandbox::ToolCall;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use serde::Serialize;

use super::Server;
use super::bottles::canonical;
use super::children::Boot;
use super::error::ApiError;

/// The largest request body read: a call whose stdin fills the in-box
/// agent's largest frame, in base64, with room for the rest of the call.
pub(crate) const MAX_BODY: usize = 80 << 20;

/// The API's version prefix.
const PREFIX: &str = "/v1/";

/// Answers one request; every answer is JSON.
pub(crate) async fn handle(
    server: Arc<Server>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let started = Instant::now();
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let answer = route(&server, request).await;
    let response = match &answer {
        Ok((status, body)) => respond(*status, body.clone()),
        Err(err) => respond(err.status, err.body()),
    };
    if server.verbose {
        let outcome = match &answer {
            Ok((status, _)) => status.as_u16().to_string(),
            Err(err) => format!("{} {}", err.status.as_u16(), err.code),
        };
        crate::output::err(&format!(
            "serve: {method} {} {outcome} {} ms\n",
            escape_for_terminal(&path),
            started.elapsed().as_millis()
        ));
    }
    Ok(response)
}

fn respond(status: StatusCode, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

type Answer = Result<(StatusCode, Vec<u8>), ApiError>;

async fn route(server: &Arc<Server>, request: Request<Incoming>) -> Answer {
    let method = request.method().clone();
    let Some(rest) = request.uri().path().strip_prefix(PREFIX) else {
        return Err(no_endpoint(&method, request.uri().path()));
    };
    let segments: Vec<String> = rest.split('/').map(str::to_string).collect();
    let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
    match (&method, segments.as_slice()) {
        (&Method::GET, ["health"]) => ok(&serde_json::json!({
            "status": "ok",
            "version": env!("CARGO_PKG_VERSION"),
        })),
        (&Method::GET, ["bottles"]) => {
            let cli = server.cli.clone();
            ok(&blocking(move || cli.list()).await?)
        }
        (&Method::POST, ["bottles"]) => {
            let boot: Boot = read_json(request).await?;
            let cli = server.cli.clone();
            let name = blocking(move || cli.boot(&boot)).await?;
            ok(&serde_json::json!({ "name": name }))
        }
        (&Method::POST, ["bottles", name, "execute"]) => {
            let name = canonical(name)?;
            let call: ToolCall = read_json(request).await?;
            ok(&server.bottles.execute(&name, call).await?)
        }
        (&Method::POST, ["bottles", name, "reset"]) => {
            let name = canonical(name)?;
            ok(&server.bottles.reset(&name).await?)
        }
        (&Method::DELETE, ["bottles", name]) => {
            let name = canonical(name)?;
            server.bottles.close(&name).await;
            let cli = server.cli.clone();
            let stopped = name.clone();
            blocking(move || cli.stop(&stopped)).await?;
            ok(&serde_json::json!({ "name": name, "stopped": true }))
        }
        _ => Err(no_endpoint(&method, request.uri().path())),
    }
}

fn ok(value: &impl Serialize) -> Answer {
    serde_json::to_vec(value)
        .map(|body| (StatusCode::OK, body))
        .map_err(|err| ApiError::internal(format!("cannot encode the answer: {err}")))
}

fn no_endpoint(method: &Method, path: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "BOT-C045",
        format!("no endpoint {method} {path}"),
        "see docs/SANDBOX.md for the endpoints (all under /v1/)",
    )
}

/// Runs blocking work (a `bottle` child) off the server's threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|err| {
            Err(ApiError::internal(format!(
                "the request's task failed: {err}"
            )))
        })
}

/// The body as `T`, read up to [`MAX_BODY`].
async fn read_json<T: serde::de::DeserializeOwned>(
    request: Request<Incoming>,
) -> Result<T, ApiError> {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "BOT-C044",
            format!("the request body is over {} MiB", MAX_BODY >> 20),
            "send less stdin per call (write a large input as a file in several calls)",
        )
    };
    // A declared length over the limit is refused before any of it is read.
    if hyper::body::Body::size_hint(request.body()).lower() > MAX_BODY as u64 {
        return Err(too_large());
    }
    let body = tokio::time::timeout(
        super::conn::BODY_TIMEOUT,
        Limited::new(request.into_body(), MAX_BODY).collect(),
    )
    .await
    .map_err(|_| {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "BOT-C048",
            format!(
                "the request body did not arrive within {} s of its head",
                super::conn::BODY_TIMEOUT.as_secs()
            ),
            "send the whole body at once after the head (a client that streams it must not pause)",
        )
    })?
    .map_err(|err| {
        if err.is::<http_body_util::LengthLimitError>() {
            too_large()
        } else {
            ApiError::bad_request(format!("cannot read the body: {err}"))
        }
    })?
    .to_bytes();
    serde_json::from_slice(&body).map_err(|err| ApiError::bad_request(err.to_string()))
}
