-- BoxOffice order service schema. Postgres is the truth for seats, orders,
-- payments and tickets; Redis only holds a view of what remains.

CREATE TABLE events (
    event_id    text PRIMARY KEY,
    name        text NOT NULL,
    price_cents bigint NOT NULL CHECK (price_cents >= 0),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- One row per event: the hot row every reservation locks, so it stays narrow.
CREATE TABLE inventory (
    event_id text PRIMARY KEY REFERENCES events ON DELETE CASCADE,
    capacity integer NOT NULL CHECK (capacity >= 0),
    reserved integer NOT NULL DEFAULT 0 CHECK (reserved >= 0),
    sold     integer NOT NULL DEFAULT 0 CHECK (sold >= 0),
    -- Bumped on every change of what remains, so the Redis view never goes back in time.
    version  bigint NOT NULL DEFAULT 0,
    CONSTRAINT never_oversell CHECK (reserved + sold <= capacity)
);

CREATE TABLE orders (
    order_id        uuid PRIMARY KEY,
    event_id        text NOT NULL REFERENCES events ON DELETE CASCADE,
    fan_id          text NOT NULL,
    quantity        integer NOT NULL CHECK (quantity > 0),
    amount_cents    bigint NOT NULL CHECK (amount_cents >= 0),
    status          text NOT NULL CHECK (status IN ('pending', 'reserved', 'charged', 'confirmed', 'failed', 'cancelled')),
    failure_reason  text,
    -- Seats first_seat .. first_seat + quantity - 1, set when the seats are sold.
    first_seat      integer,
    hold_expires_at timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);
-- The saga runner's work list.
CREATE INDEX orders_unfinished ON orders (updated_at) WHERE status IN ('pending', 'reserved', 'charged');
CREATE INDEX orders_by_event ON orders (event_id, status);

-- The charge of an order; its key is the order id, the payment idempotency key.
CREATE TABLE payments (
    order_id     uuid PRIMARY KEY REFERENCES orders ON DELETE CASCADE,
    amount_cents bigint NOT NULL,
    status       text NOT NULL CHECK (status IN ('captured', 'refunded')),
    created_at   timestamptz NOT NULL DEFAULT now()
);

-- Transactional outbox: written in the same transaction as the state change it announces.
CREATE TABLE outbox (
    id             bigserial PRIMARY KEY,
    aggregate_type text NOT NULL,
    aggregate_id   text NOT NULL,
    event_type     text NOT NULL,
    payload        jsonb NOT NULL,
    headers        jsonb NOT NULL DEFAULT '{}',
    created_at     timestamptz NOT NULL DEFAULT now(),
    published_at   timestamptz
);
CREATE INDEX outbox_unpublished ON outbox (id) WHERE published_at IS NULL;

-- Consumer-side deduplication: inserted in the same transaction as the effect.
CREATE TABLE processed_events (
    consumer     text NOT NULL,
    event_id     uuid NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);

CREATE TABLE tickets (
    ticket_id uuid PRIMARY KEY,
    order_id  uuid NOT NULL REFERENCES orders ON DELETE CASCADE,
    event_id  text NOT NULL,
    seat_no   integer NOT NULL,
    code      text NOT NULL,
    issued_at timestamptz NOT NULL DEFAULT now(),
    -- A seat is ticketed once, whatever the broker redelivers.
    UNIQUE (event_id, seat_no)
);
CREATE INDEX tickets_by_order ON tickets (order_id);
