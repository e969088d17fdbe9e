-- sealgate schema, version 7 (issue 20): two functions that do one thing for every call of a batch.
--
-- Admission without a rate window for a whole batch of concurrent calls in one statement and one commit
-- (group commit): each element is admitted as one call alone would be, in the order given: its replay
-- record first; its budget charge only when the record is new; its PENDING claim only when charged. A budget counter's state is the count as 8 big-endian bytes
-- (int8send). A batch first creates or locks all its counters, in key order: batches of different replicas
-- then never wait for each other in a circle over counters, nor over the replay records and claims of one
-- session, which only the holder of its counter writes.
CREATE FUNCTION sealgate_admit(
    signatures bytea[], signature_expiries bigint[], cells bytea[], maxes bigint[],
    claim_kinds text[], claim_ids text[], claim_times bigint[], claim_records text[])
RETURNS TABLE (ordinal integer, fresh boolean, charged boolean, claimed boolean)
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO counters (key, state)
    SELECT DISTINCT cell, NULL::bytea FROM unnest(cells) AS cell ORDER BY 1
    ON CONFLICT (key) DO UPDATE SET key = EXCLUDED.key;
    FOR i IN 1 .. coalesce(array_length(cells, 1), 0) LOOP
        ordinal := i;
        fresh := true;
        charged := false;
        claimed := false;
        IF signatures[i] IS NOT NULL THEN
            INSERT INTO seen_signatures (signature, expires_at_ms)
            VALUES (signatures[i], signature_expiries[i]) ON CONFLICT DO NOTHING;
            fresh := FOUND;
        END IF;
        IF fresh AND maxes[i] > 0 THEN
            INSERT INTO counters (key, state) VALUES (cells[i], int8send(1::bigint))
            ON CONFLICT (key) DO UPDATE
            SET state = int8send(coalesce(('x' || encode(counters.state, 'hex'))::bit(64)::bigint, 0) + 1)
            WHERE coalesce(('x' || encode(counters.state, 'hex'))::bit(64)::bigint, 0) < maxes[i];
            charged := FOUND;
        END IF;
        IF charged AND claim_ids[i] IS NOT NULL THEN
            INSERT INTO claims (kind, request_id, claimed_at_ms, record)
            VALUES (claim_kinds[i], claim_ids[i], claim_times[i], claim_records[i]) ON CONFLICT DO NOTHING;
            claimed := FOUND;
        END IF;
        RETURN NEXT;
    END LOOP;
END
$$;

-- The claims that a batch of audit events settles, each found by its primary key and changed only when it is
-- still the PENDING record the call holds; returns how many changed. A loop of single-row updates: a join of
-- the batch with the table would be planned, while the table is new and has no statistics, as a scan of the
-- whole table for every batch, and that plan stays cached as the table grows.
CREATE FUNCTION sealgate_settle(kinds text[], ids text[], pendings text[], settleds text[])
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    changed integer := 0;
BEGIN
    FOR i IN 1 .. coalesce(array_length(ids, 1), 0) LOOP
        UPDATE claims SET record = settleds[i]
        WHERE kind = kinds[i] AND request_id = ids[i] AND record = pendings[i];
        IF FOUND THEN
            changed := changed + 1;
        END IF;
    END LOOP;
    RETURN changed;
END
$$;
