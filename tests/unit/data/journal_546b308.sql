BEGIN TRANSACTION;
CREATE TABLE approvals (
    id INTEGER PRIMARY KEY,
    decision_id INTEGER NOT NULL REFERENCES decisions(id),
    policy TEXT NOT NULL,
    target TEXT NOT NULL,
    requested_at REAL NOT NULL,
    deadline REAL NOT NULL,
    status TEXT NOT NULL DEFAULT 'pending',   
    decided_at REAL,
    decided_by TEXT,
    reason TEXT
);
INSERT INTO "approvals" VALUES(1,3,'other-tail','prod/other',1.79616118029728555676e+09,1900864000.0,'pending',NULL,NULL,NULL);
INSERT INTO "approvals" VALUES(2,4,'ranker-tail','prod/ranker2',1.79616118029806971553e+09,1901728000.0,'approved',1899999995.0,'alice','looks right');
INSERT INTO "approvals" VALUES(3,5,'ranker-tail','prod/ranker3',1.79616118029931163789e+09,1000.0,'expired',2000.0,NULL,'deadline passed');
CREATE TABLE bad_versions (
    id INTEGER PRIMARY KEY,
    target TEXT NOT NULL,
    version INTEGER NOT NULL,
    reason TEXT NOT NULL,
    decision_id INTEGER,
    at REAL NOT NULL,
    cleared_at REAL,
    cleared_reason TEXT
);
INSERT INTO "bad_versions" VALUES(1,'prod/ranker',3,'rolled back to 2 by decision 1 (TailLatency): tail',1,1.79616118029529809956e+09,NULL,NULL);
INSERT INTO "bad_versions" VALUES(2,'prod/third',5,'rolled back to 4: manual',NULL,1.79616118030288386339e+09,NULL,NULL);
INSERT INTO "bad_versions" VALUES(3,'prod/ranker',9,'canary failed',NULL,1.7961611803039019108e+09,NULL,NULL);
INSERT INTO "bad_versions" VALUES(4,'prod/ranker',10,'canary failed too',NULL,1.79616118030428791041e+09,1.79616118030464148522e+09,'fixed');
INSERT INTO "bad_versions" VALUES(5,'prod/imported',3,'from the other leader',NULL,1700000001.0,NULL,NULL);
CREATE TABLE decisions (
    id INTEGER PRIMARY KEY,
    signal_id INTEGER NOT NULL REFERENCES signals(id),
    policy TEXT NOT NULL,
    target TEXT NOT NULL,
    at REAL NOT NULL,
    state TEXT NOT NULL,       
    reason TEXT NOT NULL DEFAULT '',
    plan TEXT NOT NULL DEFAULT '{}',
    executed INTEGER NOT NULL DEFAULT 0, holder TEXT, term INTEGER,  
    UNIQUE(signal_id, policy)
);
INSERT INTO "decisions" VALUES(1,1,'ranker-tail','prod/ranker',1.79616118029317045211e+09,'succeeded','done','{"actions": ["rollback"]}',1,'replica-a',1);
INSERT INTO "decisions" VALUES(2,2,'ranker-forecast','prod/ranker',1.79616118029623365402e+09,'dry_run','dry run','{"actions": []}',0,'replica-a',1);
INSERT INTO "decisions" VALUES(3,3,'other-tail','prod/other',1.79616118029728555676e+09,'blocked','awaiting approval 1 until 2030-03-27T17:46:40+00:00','{"actions": ["scale"]}',0,NULL,NULL);
INSERT INTO "decisions" VALUES(4,4,'ranker-tail','prod/ranker2',1899999995.0,'executing','approved by alice: looks right; applying','{"actions": ["rollback"]}',1,NULL,NULL);
INSERT INTO "decisions" VALUES(5,5,'ranker-tail','prod/ranker3',1.79616118029931163789e+09,'blocked','approval 3 expired at 1970-01-01T00:16:40+00:00; not applied','{"actions": ["rollback"]}',0,NULL,NULL);
CREATE TABLE evaluations (
    policy TEXT NOT NULL,
    trigger_index INTEGER NOT NULL,
    series TEXT NOT NULL,
    at REAL NOT NULL,
    fired INTEGER NOT NULL,
    reason TEXT NOT NULL,
    PRIMARY KEY (policy, trigger_index, series)
);
INSERT INTO "evaluations" VALUES('ranker-tail',0,'prod/ranker/pod-0',1.79616118030107688903e+09,1,'tail above line');
INSERT INTO "evaluations" VALUES('ranker-tail',0,'prod/ranker/pod-1',1.79616118030147719382e+09,0,'ok');
INSERT INTO "evaluations" VALUES('ranker-forecast',1,'prod/ranker',1.79616118030147719382e+09,0,'no breach forecast');
CREATE TABLE freezes (
    id INTEGER PRIMARY KEY,
    target TEXT NOT NULL,
    reason TEXT NOT NULL,
    at REAL NOT NULL,
    until REAL NOT NULL,
    decision_id INTEGER,
    lifted_at REAL,
    lifted_reason TEXT
, by TEXT, source TEXT, lifted_by TEXT);
INSERT INTO "freezes" VALUES(1,'prod/ranker','escalated',1.79616118029676365857e+09,253402300799.0,1,NULL,NULL,NULL,NULL,NULL);
INSERT INTO "freezes" VALUES(2,'prod/other','maintenance',1.79616118030509018901e+09,2215360000.0,NULL,NULL,NULL,'bob','api',NULL);
INSERT INTO "freezes" VALUES(3,'*','incident',1.79616118030548691745e+09,253402300799.0,NULL,NULL,NULL,'cm-manager','configmap',NULL);
INSERT INTO "freezes" VALUES(4,'prod/lifted','short',1.79616118030594253541e+09,2215360000.0,NULL,1.79616118030630660053e+09,'over',NULL,'cli','carol');
CREATE TABLE guard_marks (
    policy TEXT NOT NULL,
    target TEXT NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (policy, target, at)
);
INSERT INTO "guard_marks" VALUES('ranker-tail','prod/ranker',1800000000.0);
CREATE TABLE leadership (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    term INTEGER NOT NULL,
    holder TEXT NOT NULL,
    lease_transitions INTEGER,
    since REAL NOT NULL
);
INSERT INTO "leadership" VALUES(1,1,'replica-a',3,1.79616118029171967511e+09);
CREATE TABLE pin_history (
    id INTEGER PRIMARY KEY,
    target TEXT NOT NULL,
    model TEXT NOT NULL,
    version INTEGER NOT NULL,
    at REAL NOT NULL,
    from_version INTEGER,
    decision_id INTEGER,
    signal TEXT,
    reason TEXT NOT NULL DEFAULT '',
    policy TEXT,
    ended_at REAL NOT NULL,
    ended_reason TEXT NOT NULL
);
INSERT INTO "pin_history" VALUES(1,'prod/other','other',7,1.79616118030189609528e+09,NULL,NULL,NULL,'operator',NULL,1796161180.30236,'unpinned by operator');
INSERT INTO "pin_history" VALUES(2,'prod/third','third',4,1.79616118030288386339e+09,5,NULL,NULL,'manual',NULL,1.79616118030342316628e+09,'reverted');
CREATE TABLE pins (
    target TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    version INTEGER NOT NULL,
    at REAL NOT NULL,
    from_version INTEGER,      
    decision_id INTEGER,
    signal TEXT,
    reason TEXT NOT NULL DEFAULT '',
    policy TEXT
);
INSERT INTO "pins" VALUES('prod/ranker','ranker',2,1.79616118029529809956e+09,3,1,'TailLatency','tail','ranker-tail');
INSERT INTO "pins" VALUES('prod/imported','imported',5,1700000000.0,NULL,NULL,NULL,'',NULL);
CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, description TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL);
INSERT INTO "schema_migrations" VALUES(1,'journal schema as of the first PostgreSQL release',1.79616118028944730762e+09);
INSERT INTO "schema_migrations" VALUES(2,'leadership terms: fencing tokens for writes of the replica that acts',1.79616118029009556771e+09);
CREATE TABLE signals (
    id INTEGER PRIMARY KEY,
    dedup_key TEXT NOT NULL UNIQUE,
    source TEXT NOT NULL,
    name TEXT NOT NULL,
    policy TEXT,
    received_at REAL NOT NULL,
    payload TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',   
    processed_at REAL
);
INSERT INTO "signals" VALUES(1,'k1','alert','TailLatency',NULL,1.79616118029224634171e+09,'{"source":"alert","name":"TailLatency","labels":{"model":"ranker","namespace":"prod"},"observed_at":"2025-01-02T03:04:05+00:00","dedup_key":"k1","status":"firing","value":null,"policy":null,"details":{}}','processed',1.79616118030047893523e+09);
INSERT INTO "signals" VALUES(2,'k2','alert','Forecast',NULL,1.79616118029224634171e+09,'{"source":"alert","name":"Forecast","labels":{"model":"ranker","namespace":"prod"},"observed_at":"2025-01-02T03:04:05+00:00","dedup_key":"k2","status":"firing","value":null,"policy":null,"details":{}}','processed',1.79616118030047893523e+09);
INSERT INTO "signals" VALUES(3,'k3','alert','TailLatency',NULL,1.79616118029224634171e+09,'{"source":"alert","name":"TailLatency","labels":{"model":"other","namespace":"prod"},"observed_at":"2025-01-02T03:04:05+00:00","dedup_key":"k3","status":"firing","value":null,"policy":null,"details":{}}','pending',NULL);
INSERT INTO "signals" VALUES(4,'k4','alert','TailLatency',NULL,1.79616118029224634171e+09,'{"source":"alert","name":"TailLatency","labels":{"model":"ranker","namespace":"prod"},"observed_at":"2025-01-02T03:04:05+00:00","dedup_key":"k4","status":"firing","value":null,"policy":null,"details":{}}','pending',NULL);
INSERT INTO "signals" VALUES(5,'k5','alert','TailLatency',NULL,1.79616118029224634171e+09,'{"source":"alert","name":"TailLatency","labels":{"model":"ranker","namespace":"prod"},"observed_at":"2025-01-02T03:04:05+00:00","dedup_key":"k5","status":"firing","value":null,"policy":null,"details":{}}','pending',NULL);
CREATE TABLE steps (
    id INTEGER PRIMARY KEY,
    decision_id INTEGER NOT NULL REFERENCES decisions(id),
    idx INTEGER NOT NULL,
    action TEXT NOT NULL,
    phase TEXT NOT NULL,       
    status TEXT NOT NULL,
    message TEXT NOT NULL DEFAULT '',
    data TEXT NOT NULL DEFAULT '{}',
    at REAL NOT NULL,
    duration_seconds REAL
);
INSERT INTO "steps" VALUES(1,1,0,'rollback','intent','ok','plan','{"to": 2}',1.79616118029380488398e+09,NULL);
INSERT INTO "steps" VALUES(2,1,0,'rollback','apply','ok','rolled back','{"from": 3, "to": 2}',1.79616118029426836966e+09,0.25);
INSERT INTO "steps" VALUES(3,1,-1,'recovery','recovery','pending','checking','{"deadline": 123.0}',1.7961611802947821617e+09,NULL);
INSERT INTO "steps" VALUES(4,1,-1,'recovery','recovery','not_recovered','still slow','{"follow_up": "revert"}',1.79616118029673933979e+09,NULL);
CREATE INDEX signals_state ON signals(state);
CREATE INDEX decisions_guard ON decisions(policy, target, executed, at);
CREATE INDEX steps_phase ON steps(phase, decision_id);
CREATE INDEX pin_history_target ON pin_history(target, ended_at);
CREATE INDEX bad_versions_target ON bad_versions(target, cleared_at);
CREATE INDEX freezes_target ON freezes(target, until);
CREATE INDEX approvals_status ON approvals(status, policy, target);
COMMIT;
