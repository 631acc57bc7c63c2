use diesel_inbox::idempotent;

struct Msg {
    id: String,
}

#[idempotent(key = "msg.id")]
struct Handler {
    msg: Msg,
}

fn main() {}
