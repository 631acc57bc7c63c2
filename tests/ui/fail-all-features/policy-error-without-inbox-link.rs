// A broker policy over an error type that does not say where it holds the
// inbox's refusals: a compile error, not a KeyReused retried until the
// delivery limit.
use diesel_inbox::brokers::Policy;
use diesel_inbox::InboxError;

#[derive(Debug)]
enum AppError {
    Inbox(InboxError),
    BadPayload,
}

impl From<InboxError> for AppError {
    fn from(e: InboxError) -> Self {
        AppError::Inbox(e)
    }
}

fn main() {
    let _policy = Policy::new(|e: &AppError| matches!(e, AppError::BadPayload));
}
