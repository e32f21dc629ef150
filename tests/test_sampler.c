/* Sampler: greedy, filters, determinism per seed, repetition, presence and
 * frequency penalties, logit bias. */
#include "ellm.h"
#include "harness.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#define V 1000

static ellm_sampler *make(ellm_sampler_params p) {
    ellm_sampler *s = NULL;
    ellm_error err;
    CHECK(ellm_sampler_init(&p, V, &s, &err) == ELLM_OK, "%s", err.msg);
    return s;
}

int main(void) {
    ellm_error err;
    static float logits[V];
    for (int i = 0; i < V; i++) logits[i] = (float)((i * 7919) % 1000) / 100.0f; /* max 9.99 at i with (i*7919)%1000 == 999 */
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;

    ellm_sampler_params p = ellm_sampler_default_params();
    p.temperature = 0;
    ellm_sampler *s = make(p);
    CHECK(ellm_sampler_sample(s, logits, NULL, 0) == best, "greedy picks the argmax");
    {
        /* with a history but no penalty, and on ties: the first largest logit */
        const int32_t hist[3] = {best, 1, 2};
        CHECK(ellm_sampler_sample(s, logits, hist, 3) == best, "greedy with a history and penalty 1 picks the argmax");
        float tie[8] = {0, 3, 1, 3, -1, 2, 3, 0};
        ellm_sampler *s8 = NULL;
        CHECK(ellm_sampler_init(&p, 8, &s8, &err) == ELLM_OK, "sampler over 8 tokens");
        if (s8) CHECK(ellm_sampler_sample(s8, tie, hist, 3) == 1, "greedy ties go to the first largest logit");
        ellm_sampler_free(s8);
        /* the blocked scan against a plain one: ties across and inside blocks of 64, the tail, NaNs */
        enum { N = 1000 };
        static float big[N];
        int ok = 1;
        ellm_sampler *sn = NULL;
        CHECK(ellm_sampler_init(&p, N, &sn, &err) == ELLM_OK, "sampler over 1000 tokens");
        for (int t = 0; t < 200 && sn; t++) {
            uint32_t r = 0x9E3779B9u * (uint32_t)(t + 1);
            for (int i = 0; i < N; i++) {
                r = r * 1664525u + 1013904223u;
                big[i] = (float)((r >> 8) % 50); /* many equal values */
                if (t % 7 == 3 && (r >> 4) % 97 == 0) big[i] = NAN;
            }
            if (t % 5 == 1) big[N - 1 - t % 40] = 60; /* the maximum in the tail */
            if (t % 11 == 2) big[0] = NAN;
            int ref = 0;
            for (int i = 1; i < N; i++)
                if (big[i] > big[ref]) ref = i;
            ok &= ellm_sampler_sample(sn, big, NULL, 0) == ref;
        }
        CHECK(ok, "greedy equals a plain first-largest scan on 200 arrays with ties, NaNs and tails");
        ellm_sampler_free(sn);
    }
    ellm_sampler_free(s);

    /* top-k 1 at any temperature is greedy */
    p = ellm_sampler_default_params();
    p.top_k = 1;
    p.temperature = 5;
    s = make(p);
    int ok = 1;
    for (int i = 0; i < 100; i++) ok &= ellm_sampler_sample(s, logits, NULL, 0) == best;
    CHECK(ok, "top-k 1 is greedy");
    ellm_sampler_free(s);

    /* Same seed, same sequence; another seed differs. */
    p = ellm_sampler_default_params();
    p.top_k = 0;
    p.top_p = 1;
    p.min_p = 0;
    p.temperature = 3;
    int a[200], b[200], c[200];
    for (int run = 0; run < 3; run++) {
        p.seed = run == 2 ? 99 : 42;
        s = make(p);
        for (int i = 0; i < 200; i++) (run == 0 ? a : run == 1 ? b : c)[i] = ellm_sampler_sample(s, logits, NULL, 0);
        ellm_sampler_free(s);
    }
    CHECK(!memcmp(a, b, sizeof a), "same seed, same output");
    CHECK(memcmp(a, c, sizeof a) != 0, "different seeds differ");

    /* Sampled frequencies follow softmax(logits / T) on a 2-token distribution. */
    static float two[V];
    for (int i = 0; i < V; i++) two[i] = -1e30f;
    two[3] = 1.0f;
    two[7] = 0.0f; /* p(3) = e / (e + 1) = 0.731 at T = 1 */
    p = ellm_sampler_default_params();
    p.top_k = 0;
    p.top_p = 1;
    p.min_p = 0;
    p.temperature = 1;
    s = make(p);
    int n3 = 0, other = 0;
    for (int i = 0; i < 20000; i++) {
        int t = ellm_sampler_sample(s, two, NULL, 0);
        n3 += t == 3;
        other += t != 3 && t != 7;
    }
    ellm_sampler_free(s);
    CHECK(fabs(n3 / 20000.0 - 0.7311) < 0.015, "p(3) = %.4f, expected 0.731", n3 / 20000.0);
    CHECK(other == 0, "sampled a token with -inf logit");

    /* min-p 0.5 removes token 7 (prob ratio 1/e < 0.5). */
    p.min_p = 0.5f;
    s = make(p);
    ok = 1;
    for (int i = 0; i < 1000; i++) ok &= ellm_sampler_sample(s, two, NULL, 0) == 3;
    CHECK(ok, "min-p filters the tail");
    ellm_sampler_free(s);

    /* top-p 0.5 keeps only the top token (0.731 >= 0.5). */
    p.min_p = 0;
    p.top_p = 0.5f;
    s = make(p);
    ok = 1;
    for (int i = 0; i < 1000; i++) ok &= ellm_sampler_sample(s, two, NULL, 0) == 3;
    CHECK(ok, "top-p keeps the nucleus");
    ellm_sampler_free(s);

    /* Repetition penalty flips a close greedy choice away from a repeated token. */
    two[7] = 0.9f;
    p = ellm_sampler_default_params();
    p.temperature = 0;
    p.repeat_penalty = 1.5f;
    s = make(p);
    int32_t hist[3] = {3, 3, 5};
    CHECK(ellm_sampler_sample(s, two, NULL, 0) == 3, "no history: argmax");
    CHECK(ellm_sampler_sample(s, two, hist, 3) == 7, "penalized token 3 loses to 7");
    ellm_sampler_free(s);

    /* Presence and frequency penalties (OpenAI's): token 3 (logit 1.0) against 7 (0.9). */
    p = ellm_sampler_default_params();
    p.temperature = 0;
    p.presence_penalty = 0.2f;
    s = make(p);
    const int32_t once[1] = {3}, thrice[4] = {3, 3, 3, 5}, twice[2] = {3, 3};
    CHECK(ellm_sampler_sample(s, two, once, 1) == 7, "presence 0.2: a token seen once loses 0.2");
    CHECK(ellm_sampler_sample(s, two, hist + 2, 1) == 3, "presence: an unseen token keeps its logit");
    ellm_sampler_free(s);
    p.presence_penalty = 0;
    p.frequency_penalty = 0.04f;
    s = make(p);
    CHECK(ellm_sampler_sample(s, two, twice, 2) == 3, "frequency 0.04, seen twice: 1.0 - 0.08 > 0.9");
    CHECK(ellm_sampler_sample(s, two, thrice, 4) == 7, "frequency 0.04, seen 3 times: 1.0 - 0.12 < 0.9");
    ellm_sampler_free(s);
    p.repeat_last_n = 1;
    s = make(p);
    CHECK(ellm_sampler_sample(s, two, thrice, 4) == 3, "the penalties look back repeat_last_n tokens only");
    ellm_sampler_free(s);

    /* All of them against a plain reference (llama.cpp's order: bias, repeat,
     * then presence + count x frequency) on random logits and histories. */
    {
        static float lg[V], ref[V];
        int32_t h[300];
        int cnt[V];
        uint32_t r = 12345;
        int agree = 0, total = 0;
        for (int t = 0; t < 60; t++) {
            for (int i = 0; i < V; i++) {
                r = r * 1664525u + 1013904223u;
                lg[i] = (float)((int)(r >> 9) % 2000 - 1000) / 300.0f;
            }
            const int nh = 50 + t * 4;
            for (int i = 0; i < nh; i++) {
                r = r * 1664525u + 1013904223u;
                h[i] = (int32_t)((r >> 10) % 40) * 25; /* few distinct tokens, many repeats */
            }
            ellm_sampler_params q = ellm_sampler_default_params();
            q.temperature = 0;
            q.repeat_penalty = 1.0f + (float)(t % 3) * 0.2f;
            q.presence_penalty = (float)(t % 5) * 0.3f - 0.3f;
            q.frequency_penalty = (float)(t % 4) * 0.25f;
            q.repeat_last_n = t % 2 ? 64 : 0;
            int32_t bid[2] = {(int32_t)(t * 13 % V), (int32_t)(t * 29 % V)};
            float bval[2] = {(float)(t % 7) - 3.0f, t % 6 ? 1.5f : -100.0f};
            s = make(q);
            CHECK(ellm_sampler_set_logit_bias(s, bid, bval, 2, &err) == ELLM_OK, "%s", err.msg);
            memcpy(ref, lg, sizeof ref);
            for (int k = 0; k < 2; k++) ref[bid[k]] = bval[k] <= -100 ? -INFINITY : ref[bid[k]] + bval[k];
            const int from = q.repeat_last_n > 0 && nh > q.repeat_last_n ? nh - q.repeat_last_n : 0;
            memset(cnt, 0, sizeof cnt);
            for (int i = from; i < nh; i++) cnt[h[i]]++;
            for (int i = 0; i < V; i++) {
                if (!cnt[i]) continue;
                float l = ref[i];
                l = l > 0 ? l / q.repeat_penalty : l * q.repeat_penalty;
                ref[i] = l - q.presence_penalty - (float)cnt[i] * q.frequency_penalty;
            }
            int want = 0;
            for (int i = 1; i < V; i++)
                if (ref[i] > ref[want]) want = i;
            agree += ellm_sampler_sample(s, lg, h, nh) == want;
            total++;
            ellm_sampler_free(s);
        }
        CHECK(agree == total, "bias and penalties equal the reference's greedy pick in %d of %d cases", agree, total);
    }

    /* Logit bias: -100 bans, a large one forces, out of range or NaN is refused, n = 0 clears. */
    p = ellm_sampler_default_params();
    p.temperature = 0;
    s = make(p);
    {
        const int32_t ban[1] = {best}, force[1] = {5}, bad_id[1] = {V};
        const float m100[1] = {-100}, p100[1] = {100}, nan1[1] = {NAN};
        ellm_error e2;
        CHECK(ellm_sampler_set_logit_bias(s, ban, m100, 1, &e2) == ELLM_OK &&
                  ellm_sampler_sample(s, logits, NULL, 0) != best,
              "a bias of -100 bans the argmax");
        CHECK(ellm_sampler_set_logit_bias(s, force, p100, 1, &e2) == ELLM_OK && ellm_sampler_sample(s, logits, NULL, 0) == 5,
              "a bias of +100 forces a token");
        CHECK(ellm_sampler_set_logit_bias(s, bad_id, p100, 1, &e2) == ELLM_ERR_ARG && strstr(e2.msg, "outside"),
              "a token outside the vocabulary is refused: %s", e2.msg);
        CHECK(ellm_sampler_set_logit_bias(s, force, nan1, 1, &e2) == ELLM_ERR_ARG, "a NaN bias is refused");
        CHECK(ellm_sampler_sample(s, logits, NULL, 0) == 5, "a refused bias leaves the earlier one");
        CHECK(ellm_sampler_set_logit_bias(s, NULL, NULL, 0, &e2) == ELLM_OK && ellm_sampler_sample(s, logits, NULL, 0) == best,
              "n = 0 clears the biases");
        /* sampling: a banned token is never drawn */
        ellm_sampler_free(s);
        p.temperature = 1;
        p.top_k = 0;
        p.top_p = 1;
        p.min_p = 0;
        s = make(p);
        const int32_t ban3[1] = {3};
        CHECK(ellm_sampler_set_logit_bias(s, ban3, m100, 1, &e2) == ELLM_OK, "ban 3");
        int drew3 = 0;
        for (int i = 0; i < 2000; i++) drew3 += ellm_sampler_sample(s, two, NULL, 0) == 3;
        CHECK(drew3 == 0, "sampling never draws a banned token (%d times)", drew3);
    }
    ellm_sampler_free(s);

    /* Bad parameters are refused with a message. */
    p = ellm_sampler_default_params();
    p.top_p = 0;
    CHECK(ellm_sampler_init(&p, V, &s, &err) == ELLM_ERR_ARG && strstr(err.msg, "top-p"), "top-p 0");
    return test_finish();
}
